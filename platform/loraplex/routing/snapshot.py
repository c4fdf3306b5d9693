"""What a routing policy sees: the request to place and one snapshot per candidate replica.

Both are plain data so that the same policy code runs inside Ray Serve's RequestRouter (which
fills them from queue-length probes and the engines' stats) and inside the simulator.
"""
from dataclasses import dataclass, field


@dataclass(slots=True)
class RouteRequest:
    """One request to place."""

    key: str  # affinity key: "tenant" or "tenant/adapter"
    prompt_tokens: int = 0  # prompt length in tokens (or an estimate); 0 when unknown
    # Chained hashes of the prompt's fixed-size blocks (see prefix_index.chain_hashes); only the
    # prefix-matching policies read them, so callers may leave them empty for the others.
    prefix_hashes: tuple[int, ...] = ()


@dataclass(slots=True)
class ReplicaSnapshot:
    """What the router knows about one candidate replica right now."""

    replica_id: str
    running: int = 0  # requests the engine is running
    waiting: int = 0  # requests queued at the replica (or in the engine's waiting queue)
    pending_tokens: int = 0  # prompt + expected output tokens of the requests above
    kv_usage: float = 0.0  # fraction of the KV cache in use, from the engine's stats
    # Keys the engine reports it holds (e.g. loaded adapters). None means "no report": the
    # policy then relies on what it routed itself.
    held_keys: frozenset[str] | None = field(default=None)

    @property
    def load(self) -> int:
        # In-flight requests: what Serve's queue-length probe measures.
        return self.running + self.waiting
