"""What the router reads from an Engine call: its affinity key and a cheap summary of its prompt.

Pure and duck-typed (getattr only), so it runs without Ray, vLLM or the engine package, and the
Engine replica uses the same `routing_key` to record the keys it serves.

The Engine's methods are `chat(request, adapter=None, cache_salt=None, meta=None)` and
`completions(...)` alike: `request` is an OpenAI request (`messages` or `prompt`), `adapter` an
AdapterTarget (`tenant`, `name`, `lora_name`, ...) or None, `meta` a RequestMeta (`tenant_id`,
`adapter` as "name@version", ...). Arguments are found by what they look like, not by position,
so keyword and positional calls read alike. Calls that carry no tenant (health probes,
list_models, ready, num_unfinished_requests) have no key.
"""
from collections.abc import Mapping, Sequence
from hashlib import blake2b
from typing import Any

from loraplex.routing.prefix_index import chain_hashes
from loraplex.routing.snapshot import RouteRequest

CHARS_PER_TOKEN = 4  # a tokenizer-free estimate; close for English text with BPE vocabularies
# Prefix hashing cuts the prompt into blocks of this many characters (about vLLM's 16-token
# block) and reads at most max_prefix_chars of it, so a huge prompt costs a bounded hash time.
DEFAULT_BLOCK_CHARS = 64
DEFAULT_MAX_PREFIX_CHARS = 32_768
DEFAULT_OUTPUT_TOKENS = 128  # expected completion tokens when the request sets no max_tokens


def affinity_key(tenant_id: str, adapter_name: str | None = None) -> str:
    """"tenant" for base-model requests, "tenant/adapter" when an adapter is used."""
    return f"{tenant_id}/{adapter_name}" if adapter_name else tenant_id


def _arguments(args: Sequence[Any], kwargs: Mapping[str, Any]) -> list[Any]:
    return [*(args or ()), *((kwargs or {}).values())]


def _is_request(value: Any) -> bool:
    return hasattr(value, "messages") or hasattr(value, "prompt")


def _find(values: list[Any], *attrs: str) -> Any:
    for value in values:
        if value is not None and all(hasattr(value, a) for a in attrs):
            return value
    return None


def _find_server_side(values: list[Any], *attrs: str) -> Any:
    # vLLM's OpenAI requests keep unknown JSON fields as attributes, so a client could send
    # "tenant_id": the key comes only from what the ingress built (meta, adapter).
    return _find([v for v in values if not _is_request(v)], *attrs)


def _str_attr(obj: Any, name: str) -> str | None:
    value = getattr(obj, name, None)
    return value if isinstance(value, str) and value else None


def routing_key(args: Sequence[Any], kwargs: Mapping[str, Any]) -> str | None:
    """The affinity key of an Engine call, or None when it has no tenant."""
    values = _arguments(args, kwargs)
    meta = _find_server_side(values, "tenant_id")
    adapter = _find_server_side(values, "lora_name", "name")
    tenant = _str_attr(meta, "tenant_id") or _str_attr(adapter, "tenant")
    if tenant is None:
        return None
    name = _str_attr(adapter, "name")
    if name is None and (label := _str_attr(meta, "adapter")):
        name = label.split("@", 1)[0]  # "name@version": versions of one adapter share a key
    return affinity_key(tenant, name)


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Mapping):
        text = content.get("text")
        return text if isinstance(text, str) else _content_text(content.get("content"))
    if isinstance(content, Sequence):
        return "".join(_content_text(part) for part in content)
    return _content_text(getattr(content, "text", None) or getattr(content, "content", None))


def prompt_of(request: Any) -> str | list[int] | None:
    """The prompt as text (chat messages joined as "role: content" lines, or a completion
    prompt), or as token ids when the client sent ids; None when there is none."""
    messages = getattr(request, "messages", None)
    if isinstance(messages, Sequence) and not isinstance(messages, str):
        lines = []
        for m in messages:
            get = m.get if isinstance(m, Mapping) else lambda k, m=m: getattr(m, k, None)
            lines.append(f"{get('role') or ''}: {_content_text(get('content'))}\n")
        return "".join(lines)
    prompt = getattr(request, "prompt", None)
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, Sequence) and prompt:
        first = prompt[0]
        if isinstance(first, str):
            return "\n".join(p for p in prompt if isinstance(p, str))
        if isinstance(first, int):
            return list(prompt)
        if isinstance(first, Sequence):  # a batch of token-id prompts: the first stands for all
            return list(first)
    return None


def route_request(args: Sequence[Any], kwargs: Mapping[str, Any], *,
                  prefix_hashes: bool = False, block_chars: int = DEFAULT_BLOCK_CHARS,
                  max_prefix_chars: int = DEFAULT_MAX_PREFIX_CHARS) -> RouteRequest | None:
    """The RouteRequest for an Engine call, or None when it has no affinity key.

    prompt_tokens is estimated as characters / 4 (or the number of token ids). When
    prefix_hashes is set, the prompt's leading max_prefix_chars are cut into blocks of
    block_chars characters (block_chars / 4 token ids for id prompts) and chain-hashed. The
    chain starts with the cache salt and the adapter's lora_name, as vLLM's block hashes do, so
    two tenants' equal prompts never look shared when their KV blocks are not.
    """
    key = routing_key(args, kwargs)
    if key is None:
        return None
    values = _arguments(args, kwargs)
    request = _find(values, "messages") or _find(values, "prompt")
    prompt = prompt_of(request) if request is not None else None
    if prompt is None:
        return RouteRequest(key)
    is_text = isinstance(prompt, str)
    tokens = len(prompt) // CHARS_PER_TOKEN if is_text else len(prompt)
    route = RouteRequest(key, tokens)
    if prefix_hashes:
        adapter = _find_server_side(values, "lora_name", "name")
        salt = (kwargs or {}).get("cache_salt")
        if salt is None and len(args or ()) > 2 and isinstance(args[2], str):
            salt = args[2]  # chat(request, adapter, cache_salt, meta)
        head = f"{salt or ''}\x00{_str_attr(adapter, 'lora_name') or ''}\x00"
        if is_text:
            route.prefix_hashes = chain_hashes(head + prompt[:max_prefix_chars], block_chars)
        else:
            block = max(1, block_chars // CHARS_PER_TOKEN)
            ids = prompt[:max_prefix_chars // CHARS_PER_TOKEN]
            # The salt and adapter go in as a leading pseudo-token, folded into every hash.
            route.prefix_hashes = chain_hashes([_text_id(head)] + ids, block)
    return route


def _text_id(text: str) -> int:
    return int.from_bytes(blake2b(text.encode(), digest_size=8).digest(), "big")


def expected_tokens(args: Sequence[Any], kwargs: Mapping[str, Any], prompt_tokens: int,
                    default_output: int = DEFAULT_OUTPUT_TOKENS) -> int:
    """Prompt plus expected completion tokens: the request's max tokens, else a default."""
    values = _arguments(args, kwargs)
    request = _find(values, "messages") or _find(values, "prompt")
    output = None
    for attr in ("max_completion_tokens", "max_tokens"):
        value = getattr(request, attr, None)
        if isinstance(value, int) and value > 0:
            output = value
            break
    return prompt_tokens + (output if output is not None else default_output)
