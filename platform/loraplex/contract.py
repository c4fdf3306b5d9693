"""The contract between the ingress, the router and an Engine replica.

The ingress builds one `EngineCall` per request and calls `Engine.generate(call, request)`;
the router reads the call's `routing_key` and `prompt_tokens`; the Engine replica meters from
it. The replica streams back `EngineChunk`s (SSE or JSON bytes, coalesced) or one `EngineError`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import NamedTuple, Optional

from loraplex.errors import StatusError

SSE_DONE = "data: [DONE]\n\n"


def sse_error(status: int, message: str, type: str | None = None) -> bytes:
    """An SSE error event, as vLLM's server ends a stream that failed after it started; OpenAI
    clients raise it as an APIError."""
    return f"data: {json.dumps(StatusError(message, status=status, type=type).body())}\n\n".encode()


@dataclass
class EngineError:
    """A request the engine refused before generating (bad params, unknown model, too long)."""

    status: int
    message: str
    type: Optional[str] = None  # OpenAI's error type; None: the status's usual one
    param: Optional[str] = None
    # The engine failed after it took the request: the replica billed it (`engine_error`), so
    # the ingress must not also count it as a refusal.
    billed: bool = False
    retry_after: Optional[int] = None  # seconds, for a 503 the client should retry
    # Why the replica refused, for the ledger's and the metrics' refusal reason (`503:<reason>`).
    reason: Optional[str] = None

    def body(self) -> dict:
        return StatusError(self.message, status=self.status, param=self.param, type=self.type).body()


@dataclass(frozen=True)
class AdapterTarget:
    """The one adapter version a request runs with, as resolved by the ingress for its tenant."""

    lora_name: str  # tenant/name@version:sha256: one per version, so vLLM's prefix cache never mixes weights
    lora_int_id: int  # the catalog row id: the same on every replica
    tenant: str
    name: str
    sha256: str
    requested_as: str  # what the client put in `model`; replies echo it back
    version: int = 0  # the tenant's version number of `name`

    @property
    def label(self) -> str:
        """name@version, as usage records and reports show the adapter."""
        return f"{self.name}@{self.version}"


def affinity_key(tenant_id: str, adapter_name: str | None = None) -> str:
    """"tenant" for base-model requests, "tenant/adapter" when an adapter is used: versions of
    one adapter share a key, since a tenant's traffic on it shares its prompts."""
    return f"{tenant_id}/{adapter_name}" if adapter_name else tenant_id


@dataclass(frozen=True, slots=True)
class EngineCall:
    """Everything about one request besides its OpenAI body, built once by the ingress.

    Who pays (tenant, key), what runs (adapter version, cache salt), when it must end
    (deadline), how it is placed (routing key, prompt estimate, priority). Never built from the
    client's JSON: a client cannot choose its tenant, salt or key.
    """

    request_id: str  # the ledger's idempotency key; also vLLM's request id and the reply's id
    tenant_id: Optional[str] = None  # None: an open deployment without tenants (nothing metered)
    api_key_id: Optional[str] = None
    adapter: Optional[AdapterTarget] = None  # None: the base model
    cache_salt: Optional[str] = None  # mixed into vLLM's KV block hashes: no sharing across tenants
    arrival_time: float = 0.0  # epoch seconds when the ingress received the request
    deadline: Optional[float] = None  # epoch seconds after which the request is cut; None: no limit
    priority: int = 0  # load shedding and the fair queue's tier: higher is shed later, served first
    weight: float = 1.0  # the tenant's plan weight: its share of a replica's tokens in the fair queue
    stream: bool = False
    # Routing: the affinity key ("tenant" or "tenant/adapter"; None routes by load only), the
    # prompt length estimate and the completion cap the router counts as pending work.
    routing_key: Optional[str] = None
    prompt_tokens: int = 0
    max_tokens: Optional[int] = None

    @property
    def adapter_label(self) -> Optional[str]:
        return self.adapter.label if self.adapter is not None else None


class EngineChunk(NamedTuple):
    """One stream item from an Engine replica: ready-to-send bytes (SSE events, or the JSON body
    of a non-stream reply) and the request's token counts so far. The ingress passes `data`
    through untouched and keeps the counts: if the replica dies, they are what the client got."""

    data: bytes
    prompt_tokens: int
    cached_prompt_tokens: int
    completion_tokens: int
    first_token_time: Optional[float] = None
    # The request's last chunk: it is metered, so the ingress may free its admission (a
    # concurrency slot) before the client sees the reply end and sends its next request.
    final: bool = False


@dataclass
class RequestUsage:
    """Tokens the engine really processed for one client request, whatever way it ended.

    Counted from vLLM's RequestOutputs, not from what reached the client, so a stream cut by a
    disconnect is still counted for what was generated.
    """

    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: Optional[str] = None
    replica_id: str = ""
    first_token_time: Optional[float] = None  # epoch seconds of the first completion token
    finish_time: Optional[float] = None  # epoch seconds when the engine stopped for this request
    scheduled_time: Optional[float] = None  # epoch seconds when vLLM first scheduled it (its queue time ends)
    # How it ended, in the ledger's terms (accounting.record.STATUSES); set when it ends.
    status: Optional[str] = None
    # The vLLM request ids serving this client request (one per prompt of a batched completion).
    engine_request_ids: list = field(default_factory=list, repr=False)
    _completion_by_output: dict = field(default_factory=dict, repr=False)

    def longest_output(self) -> int:
        """Tokens of the longest choice (what time per output token divides by); completion_tokens
        when no per-choice counts were kept."""
        longest = 0
        for per_choice in self._completion_by_output.values():
            for key, n in per_choice.items():
                if key != "cached" and n > longest:
                    longest = n
        return longest or self.completion_tokens

    def chunk(self, data: bytes, final: bool = False) -> EngineChunk:
        return EngineChunk(data, self.prompt_tokens, self.cached_prompt_tokens, self.completion_tokens,
                           self.first_token_time, final)
