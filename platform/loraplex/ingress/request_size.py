"""What one OpenAI request makes the engine run, and the per-request caps on it.

A request is not one unit of work: vLLM runs `n` choices of each prompt, and a completion's
`prompt` may be a list of prompts (strings or token-id lists) or of `prompt_embeds`, so one
request is `n x prompts` sequences in the batch (beam search too: `n` is its width; `best_of` is
no field of vLLM 0.32's requests, kept as an unknown extra and never run, so it counts nothing). Admission, the fair queue, shedding and the
dispatch limit count those (EngineCall.sequences). A request that sets no max_tokens gets vLLM's
own default, which is what it may really generate: a completion 16 (the protocol's default), a
chat request the rest of the context (max_model_len - prompt).

The caps (TenantLimits: max_n, max_prompts_per_request, max_tokens_per_request,
max_sequences_per_request; per plan, a tenant's own wins) refuse a request over them with 400
naming the cap and its value; a chat request without max_tokens under a max_tokens cap runs with
the cap as its max_tokens. A request needing more sequences than its tenant's
max_concurrent_requests could never be admitted: 400 too, never a wait.

Above every plan, the server's bound (`server_bound`): one request never carries more sequences
than its pool's replica runs in one batch (engine.max_num_seqs), nor more prompts than vLLM's
parser takes (VLLM_MAX_COMPLETION_PROMPTS). It is checked on the JSON body before vLLM parses it,
so a client never reads vLLM's server-side advice ("set the VLLM_... environment variable").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from loraplex.errors import StatusError

# vLLM's parser refuses a longer prompt list with server-side advice (envs.VLLM_MAX_COMPLETION_PROMPTS's default).
VLLM_MAX_PROMPTS = 1024

REASON = "400:request_cap"  # the ledger's and the metrics' word for a refusal here


@dataclass(frozen=True)
class RequestSize:
    choices: int  # n
    prompts: int
    max_tokens: Optional[int]  # what the client asked (None: not set)

    @property
    def sequences(self) -> int:
        return self.choices * self.prompts


def _field(request, name: str) -> Any:
    """A field of a parsed OpenAI request, or of its JSON body (a dict) before vLLM parses it."""
    return request.get(name) if isinstance(request, dict) else getattr(request, name, None)


def prompt_count(request) -> int:
    """Prompts in the request: a chat request has one; a completion's `prompt` may be a list of
    strings or of token-id lists (a flat list of ints is one prompt), `prompt_embeds` a list."""
    if _field(request, "messages") is not None:
        return 1
    count = 0
    prompt = _field(request, "prompt")
    if isinstance(prompt, list) and prompt:
        count += 1 if isinstance(prompt[0], int) else len(prompt)
    elif prompt:  # one string
        count += 1
    embeds = _field(request, "prompt_embeds")
    if isinstance(embeds, list):
        count += len(embeds)
    elif embeds:
        count += 1
    return max(count, 1)


def asked_max_tokens(request) -> Optional[int]:
    asked = _field(request, "max_completion_tokens") or _field(request, "max_tokens")
    return asked if isinstance(asked, int) else None  # a body's wrong type is the parser's to refuse


def request_size(request) -> RequestSize:
    """The size of a parsed OpenAI request, or of its JSON body (a field of the wrong type counts
    as unset: vLLM's parser refuses it next)."""
    n = _field(request, "n")
    n = n if isinstance(n, int) and not isinstance(n, bool) else 1
    return RequestSize(choices=max(n, 1), prompts=prompt_count(request), max_tokens=asked_max_tokens(request))


def server_bound(max_num_seqs: int) -> int:
    """Most sequences one request may carry on a pool whose replicas batch `max_num_seqs`."""
    return min(max_num_seqs, VLLM_MAX_PROMPTS)


def _over(cap_name: str, cap: int, what: str, value: int, param: str, fix: str) -> StatusError:
    """400 whose message names the cap and its value; `code` is the cap's name."""
    return StatusError(f"This request asks for {what} {value}, over your tenant's {cap_name} ({cap}); {fix}.",
                       status=400, param=param, code=cap_name, reject_reason=REASON)


def check_bound(size: RequestSize, bound: int) -> None:
    """400 when the request carries more sequences than the server's bound (server_bound), which
    no plan lifts."""
    if size.sequences > bound:
        what = "n =" if size.prompts == 1 else "sequences (n x prompts):"
        raise StatusError(
            f"This request asks for {what} {size.sequences}, over this server's bound of {bound} sequences per "
            f"request (what one engine replica runs in one batch; no plan lifts it); keep n x prompts at or "
            f"under {bound}, or split the request.",
            status=400, param="n" if size.prompts == 1 else "prompt", code="max_sequences_per_request",
            reject_reason=REASON)


def check_caps(size: RequestSize, limits) -> None:
    """400 naming the first cap the request is over (limits: the principal's TenantLimits)."""
    chat = size.prompts == 1
    if limits.max_n is not None and size.choices > limits.max_n:
        raise _over("max_n", limits.max_n, "n =", size.choices, "n", f"ask for at most {limits.max_n} choices")
    if limits.max_prompts_per_request is not None and size.prompts > limits.max_prompts_per_request:
        raise _over("max_prompts_per_request", limits.max_prompts_per_request, "prompts:", size.prompts, "prompt",
                    f"send at most {limits.max_prompts_per_request} prompts per request")
    if limits.max_tokens_per_request is not None and size.max_tokens is not None \
            and size.max_tokens > limits.max_tokens_per_request:
        raise _over("max_tokens_per_request", limits.max_tokens_per_request, "max_tokens =", size.max_tokens,
                    "max_tokens", f"set max_tokens to at most {limits.max_tokens_per_request}")
    if limits.max_sequences_per_request is not None and size.sequences > limits.max_sequences_per_request:
        raise _over("max_sequences_per_request", limits.max_sequences_per_request, "sequences (n x prompts):",
                    size.sequences, "n" if chat else "prompt",
                    f"keep n x prompts at or under {limits.max_sequences_per_request}")
    concurrent = limits.max_concurrent_requests
    if concurrent is not None and size.sequences > concurrent:
        raise _over("max_concurrent_requests", concurrent, "sequences (n x prompts):", size.sequences,
                    "n" if chat else "prompt",
                    "each sequence holds one of its slots while it runs, so this request could never start; "
                    f"keep n x prompts at or under {concurrent}")


def apply_max_tokens_cap(oai_request, size: RequestSize, limits) -> None:
    """A request that sets no max_tokens under a max_tokens cap runs with the cap (a chat
    request would otherwise run to the end of the context)."""
    cap = limits.max_tokens_per_request
    if cap is None or size.max_tokens is not None:
        return
    if hasattr(oai_request, "max_completion_tokens"):
        oai_request.max_completion_tokens = cap
    else:
        oai_request.max_tokens = cap


def effective_max_tokens(oai_request, prompt_tokens: int, max_model_len: Optional[int],
                         fallback: int) -> int:
    """The completion tokens each sequence may really generate: what it asked (at most the rest
    of the context), else vLLM's default: a completion's is already in its max_tokens (16), a
    chat request's is the rest of the context, max_model_len - prompt. `fallback` when the
    context length is unknown here (engine.max_model_len null: the model's own)."""
    asked = asked_max_tokens(oai_request)
    room = max(max_model_len - prompt_tokens, 1) if max_model_len is not None else None
    if asked is None:
        return room if room is not None else fallback
    return min(asked, room) if room is not None else asked
