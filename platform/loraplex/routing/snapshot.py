"""What a routing policy sees: the request to place and one snapshot per candidate replica.

Both are plain data so that the same policy code runs inside Ray Serve's RequestRouter (which
fills them from queue-length probes and the engines' stats) and inside the simulator.
"""
from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(slots=True)
class RouteRequest:
    """One request to place."""

    key: str  # affinity key: "tenant" or "tenant/adapter"
    prompt_tokens: int = 0  # prompt length in tokens (or an estimate); 0 when unknown
    # The key names an adapter (it runs in one of vLLM's LoRA slots). Keyword-only: subclasses
    # (bench's PrefixRequest) add positional fields.
    adapter: bool = field(default=False, kw_only=True)


@dataclass(slots=True)
class ReplicaSnapshot:
    """What the router knows about one candidate replica right now."""

    replica_id: str
    in_flight: int = 0  # requests at the replica (Serve's queue length), running or queued
    # Of those, the requests the engine last reported queued rather than in its batch: waiting
    # in vLLM or in the replica's fair queue (0 when unknown). They count twice in `load`: a new request there waits behind them for a batch
    # slot or KV blocks, where on a replica with the same in_flight all running it joins at once.
    waiting: int = 0
    pending_tokens: int = 0  # prompt + expected output tokens this router has in flight there
    kv_usage: float = 0.0  # fraction of the KV cache in use, from the engine's stats
    # Keys the engine reports it holds (e.g. loaded adapters). None means "no report": the
    # policy then relies on what it routed itself.
    held_keys: frozenset[str] | None = field(default=None)
    # Adapters (affinity keys) in the engine's GPU slots and in its CPU tier, its slot count
    # and its recent demand per adapter, as last reported; None / 0 / empty: not reported.
    slot_adapters: frozenset[str] | None = None
    cpu_adapters: frozenset[str] | None = None
    max_loras: int = 0
    adapter_demand: Mapping[str, float] = field(default_factory=dict)

    @property
    def load(self) -> int:
        return self.in_flight + self.waiting
