"""The contract between the ingress, the router and an Engine replica. Imports nothing of ours.

The ingress builds one `EngineCall` per request and calls `Engine.generate(call, request)`
through an `EngineClient`; the router reads the call's `routing_key` and `prompt_tokens`
(`generate_args` finds the call in a call to the Engine deployment); the Engine replica drives an `EngineBackend` (vLLM, or a benchmark's fake) and meters from the call. The
replica streams back `EngineChunk`s (SSE or JSON bytes, coalesced) or one `EngineError`. The
limiter's shared state is a `LimiterBackend`. tests/unit/test_contract.py checks every
implementation against these Protocols, signatures included.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable, NamedTuple, Optional, Protocol, runtime_checkable

# OpenAI's error `type` per status; others: server_error (5xx) or invalid_request_error.
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "conflict_error",
    408: "timeout_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    503: "service_unavailable",
    504: "timeout_error",
}


def error_body(message: str, status: int, *, type: Optional[str] = None, param: Optional[str] = None,
               code: Any = None) -> dict[str, Any]:
    """OpenAI's error body: {"error": {"message", "type", "param", "code"}}; `type` defaults to
    the status's usual one, `code` to the status."""
    type = type or ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": type, "param": param, "code": status if code is None else code}}

SSE_DONE = "data: [DONE]\n\n"


def sse_error(status: int, message: str, type: str | None = None) -> bytes:
    """An SSE error event, as vLLM's server ends a stream that failed after it started; OpenAI
    clients raise it as an APIError."""
    return f"data: {json.dumps(error_body(message, status, type=type))}\n\n".encode()


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
    code: Optional[str] = None  # the error body's `code`; None: the status

    def body(self) -> dict:
        return error_body(self.message, self.status, type=self.type, param=self.param, code=self.code)


class EngineLost(Exception):
    """The replica running `call` was lost after its first chunk. Raised by an EngineClient that
    sent a different call than the ingress built (the dedicated path's `path="merged"`), so the
    ingress bills the lost request from the call that actually ran."""

    def __init__(self, call: "EngineCall", cause: BaseException, migrated_prompt_tokens: int = 0):
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.call = call
        self.cause = cause
        # Raised by the ingress's migration after the request moved (ingress/migration.py): the
        # prompt tokens the replicas it moved to prefilled, for the ingress's record of the loss.
        self.migrated_prompt_tokens = migrated_prompt_tokens


class ReplicaStopping(Exception):
    """Raised by an Engine replica that Serve stops (scale-down, redeploy, failed health check) to a
    call still running when its graceful period ends: the replica did not meter it; the ingress moves
    it to another replica (ingress/migration.py) or bills what its client received."""


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
class Resumed:
    """What earlier replicas did for a request that moved to another replica (ingress/migration.py):
    the replica that takes it over meters the request as one, from these and its own counts."""

    migrations: int  # moves so far, this one included
    prompt_tokens: int = 0  # the client's prompt as the first replica counted it; 0: none reported
    cached_prompt_tokens: int = 0
    completion_tokens: int = 0  # tokens the client already received from earlier replicas
    first_token_time: Optional[float] = None
    migrated_prompt_tokens: int = 0  # prompt tokens earlier take-overs prefilled (the platform's cost)


@dataclass(frozen=True, slots=True)
class SloTargets:
    """The latency a request's SLO class promises (its tenant's plan's, or the tenant's own): what
    the tenant scheduler sizes steps and orders prefill by, and what its attainment is counted against."""

    name: str  # the class (slo.classes), as metrics label it
    ttft_s: Optional[float] = None  # time to first token, P95; None: no target (batch work)
    tpot_s: Optional[float] = None  # time per output token, P95; None: no target

    def met(self, ttft_s: Optional[float], tpot_s: Optional[float]) -> bool:
        """A finished request was within this class's targets (a missing measure meets its target)."""
        return ((self.ttft_s is None or ttft_s is None or ttft_s <= self.ttft_s)
                and (self.tpot_s is None or tpot_s is None or tpot_s <= self.tpot_s))


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
    # The tenant's SLO class: the engine keeps its targets (step size, prefill order, shedding);
    # None: no class (health probes, batch lines), the engine's own targets.
    slo: Optional[SloTargets] = None
    stream: bool = False
    # Routing: the affinity key ("tenant" or "tenant/adapter"; None routes by load only), the
    # prompt length estimate and the completion cap the router counts as pending work.
    routing_key: Optional[str] = None
    prompt_tokens: int = 0
    max_tokens: Optional[int] = None
    # What runs in the engine: `n` x the prompts of the request (a completion's `prompt` may be a
    # list). Admission, the fair queue, shedding and the dispatch limit count these, not requests;
    # prompt_tokens is all prompts' and max_tokens each sequence's.
    sequences: int = 1
    # How an adapter call runs: "lora" (vLLM's LoRA on the shared Engine pool) or "merged" (the
    # version's dedicated replica, whose base weights have the adapter merged in). The usage
    # record says which; base-model calls ignore it.
    path: str = "lora"
    # A Batch API line (issue 36): the fair queue and the tenant scheduler serve it below every
    # online request, and its usage record is marked batch (priced at the plan's batch price).
    batch: bool = False
    # The base model (its engine pool) that runs the call; None: the config's first (or only) base.
    base_model: Optional[str] = None
    # A request moved here from a lost replica: what the earlier replicas did (metered as one request).
    resumed: Optional[Resumed] = None
    # The replica a moved request was lost on: the router places it elsewhere while others remain.
    avoid_replica: Optional[str] = None
    # The Ingress replica (its Serve actor name) that consumes the reply: the Engine replica aborts
    # the call if it dies (engine/caller_watch.py). Set by ingress/engine_client.py.
    caller: Optional[str] = None

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
    # The replica that sent it: where a request lost mid-stream must not be sent again.
    replica_id: Optional[str] = None


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
    # Prompt tokens prefilled again by the replicas the request moved to (the ingress's record of a
    # request lost after moving; an Engine replica's record counts its own from EngineCall.resumed).
    migrated_prompt_tokens: int = 0
    # The vLLM request ids serving this client request (one per prompt of a batched completion).
    engine_request_ids: list = field(default_factory=list, repr=False)
    _completion_by_output: dict = field(default_factory=dict, repr=False)
    # Called once, when the first completion token is out: the Engine replica's fair queue paces
    # a tenant's prefills by it. Never sent anywhere (a callable does not pickle).
    on_first_token: Optional[Callable[[], None]] = field(default=None, repr=False, compare=False)

    def first_token(self) -> None:
        """The first completion token is out (engines call this): note when, tell on_first_token."""
        if self.first_token_time is None:
            self.first_token_time = time.time()
            if self.on_first_token is not None:
                self.on_first_token()

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
                           self.first_token_time, final, self.replica_id or None)


def generate_args(args: tuple, kwargs: dict) -> tuple[Optional[EngineCall], Any]:
    """(call, request) of a call to the Engine deployment, by the contract's one convention:
    `Engine.generate(call, request)`, positional or by those keywords (EngineClient.generate
    sends them positionally). (None, None) for the deployment's other methods (health, models),
    which the router places by load only."""
    call = args[0] if args else kwargs.get("call")
    if not isinstance(call, EngineCall):
        return None, None
    return call, args[1] if len(args) > 1 else kwargs.get("request")


# -- the interfaces ------------------------------------------------------------------------------
@runtime_checkable
class EngineAdapters(Protocol):
    """The adapters an engine holds (engine/loaded_adapters.py's LoadedAdapters)."""

    targets: dict

    def loaded_ids(self) -> list[int]: ...

    async def retire(self, lora_int_ids: set[int]) -> None: ...

    def note_resident(self, lora_int_ids: set[int], sampled_at: float = float("inf")) -> int: ...


@runtime_checkable
class EngineBackend(Protocol):
    """The engine the Engine deployment drives: engine/vllm_engine.py's VLLMEngine, or a fake in
    benchmarks (`engine_cls` of build_app). Built as cls(config, replica_id, adapter_store,
    metrics); `generate` meters into `usage` as it streams (RequestUsage's fields)."""

    adapters: EngineAdapters
    probes_done: int

    def __init__(self, config: Any, replica_id: str = "", adapter_store: Any = None, metrics: Any = None): ...

    async def start(self) -> None: ...

    def generate(self, call: EngineCall, request: Any, usage: RequestUsage) -> AsyncIterator[Any]: ...

    async def base_models(self) -> dict[str, Any]: ...

    def num_unfinished_requests(self) -> int: ...

    async def resident_adapter_ids(self) -> set[int]: ...

    def last_progress(self) -> float: ...

    async def probe(self, timeout_s: float = 60.0) -> float: ...

    async def shutdown(self) -> None: ...


@runtime_checkable
class EngineClient(Protocol):
    """How the ingress reaches the Engine deployment (ingress/engine_client.py's
    ServeEngineClient over a DeploymentHandle; unit tests' fakes)."""

    def generate(self, call: EngineCall, request: Any) -> AsyncIterator[EngineChunk | EngineError]: ...

    async def base_models(self) -> dict[str, Any]: ...

    async def ready(self) -> dict[str, Any]: ...

    async def replica_status(self) -> dict[str, Any]: ...


@runtime_checkable
class LimiterBackend(Protocol):
    """The limiter's shared state (admission/limiter.py's LocalBackend in-process,
    admission/ray_backend.py's RayBackend across replicas)."""

    async def acquire(self, tenant: str, holder: str, limits: dict, need: dict, want: dict) -> Any: ...

    async def give_back(self, tenant: str, holder: str, epoch: str, returned: dict, consumed: dict) -> None: ...

    async def touch(self, tenant: str, holder: str) -> None: ...
