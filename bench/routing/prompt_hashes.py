"""What the prefix-matching policies read of a prompt: chained hashes of its leading blocks.

A router does not tokenize, so a text prompt is cut into blocks of characters (about vLLM's
16-token block at 4 characters a token) and token-id prompts into blocks of ids. Each block's
hash is chained over all blocks before it, so one hash names a whole prefix, as vLLM's block
hashes do. The chain starts with the call's cache salt and adapter, as vLLM's does, so two
tenants' equal prompts never look shared when their KV blocks are not.
"""
from collections.abc import Mapping, Sequence
from hashlib import blake2b
from typing import Any

CHARS_PER_TOKEN = 4  # a tokenizer-free estimate; close for English text with BPE vocabularies
DEFAULT_BLOCK_CHARS = 64
# At most this much of a prompt is hashed, so a huge prompt costs a bounded time.
DEFAULT_MAX_PREFIX_CHARS = 32_768


def chain_hashes(prompt: str | Sequence[int], block_size: int = 64) -> tuple[int, ...]:
    """Chained hashes of the prompt's full blocks (characters of a text, or token ids).

    A trailing partial block is left out: engines cache only full blocks.
    """
    hashes, prev = [], b""
    for start in range(0, len(prompt) - block_size + 1, block_size):
        block = prompt[start:start + block_size]
        data = block.encode() if isinstance(block, str) else repr(list(block)).encode()
        prev = blake2b(prev + data, digest_size=8).digest()
        hashes.append(int.from_bytes(prev, "big"))
    return tuple(hashes)


def prompt_hashes(request: Any, salt: str | None = None, lora_name: str | None = None,
                  block_chars: int = DEFAULT_BLOCK_CHARS,
                  max_prefix_chars: int = DEFAULT_MAX_PREFIX_CHARS) -> tuple[int, ...]:
    """The chained block hashes of an OpenAI request's prompt (() when it has none).

    The prompt's leading max_prefix_chars are cut into blocks of block_chars characters
    (block_chars / 4 ids for token-id prompts); the salt and adapter start the chain.
    """
    prompt = prompt_of(request)
    if prompt is None:
        return ()
    head = f"{salt or ''}\x00{lora_name or ''}\x00"
    if isinstance(prompt, str):
        return chain_hashes(head + prompt[:max_prefix_chars], block_chars)
    ids = prompt[:max_prefix_chars // CHARS_PER_TOKEN]
    # The salt and adapter go in as a leading pseudo-token, folded into every hash.
    head_id = int.from_bytes(blake2b(head.encode(), digest_size=8).digest(), "big")
    return chain_hashes([head_id] + ids, max(1, block_chars // CHARS_PER_TOKEN))


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
