"""The Engine replica's side of routing: which affinity keys it served lately, and the stats dict
its `record_routing_stats()` returns to Ray Serve.

Serve calls `record_routing_stats()` on every replica each `request_routing_stats_period_s`
and hands the dict to every router as `RunningReplica.routing_stats`. The contract
(`routing_stats` builds it; every field is optional to the router):

    {
      "held_keys": ["ten_a/bot", "ten_b", ...],  # affinity keys, most recently served first
      "running": 3,      # requests the engine is running
      "waiting": 0,      # requests queued in the engine
      "kv_usage": 0.42,  # fraction of the KV cache in use
    }

The router takes held_keys as the truth for that replica (keeping keys it routed there since
the report), which drops keys the engine evicted and teaches every ingress replica the keys
the others routed. The dict travels through the controller to every router, so held_keys is
capped (max_keys).
"""
from collections import OrderedDict
from collections.abc import Iterable

DEFAULT_SERVED_KEYS = 256
DEFAULT_MAX_REPORTED_KEYS = 256


class ServedKeys:
    """An LRU of the affinity keys a replica served, most recent last."""

    def __init__(self, capacity: int = DEFAULT_SERVED_KEYS):
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self._keys: OrderedDict[str, None] = OrderedDict()

    def touch(self, key: str | None) -> None:
        """Record a served request's key (None, for calls without a tenant, is ignored)."""
        if key is None:
            return
        self._keys.pop(key, None)
        self._keys[key] = None
        if len(self._keys) > self.capacity:
            self._keys.popitem(last=False)

    def discard(self, key: str) -> None:
        """Forget a key, e.g. when its adapter was unloaded or deleted."""
        self._keys.pop(key, None)

    def recent(self) -> list[str]:
        """The keys, most recently served first."""
        return list(reversed(self._keys))

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, key: object) -> bool:
        return key in self._keys


def routing_stats(held_keys: Iterable[str], running: int | None = None,
                  waiting: int | None = None, kv_usage: float | None = None,
                  max_keys: int = DEFAULT_MAX_REPORTED_KEYS) -> dict:
    """The dict an Engine replica's record_routing_stats() returns (see the module docstring).

    held_keys go most recent first and are cut at max_keys; unknown numbers are left out.
    """
    stats: dict = {"held_keys": [k for _, k in zip(range(max_keys), held_keys)]}
    if running is not None:
        stats["running"] = int(running)
    if waiting is not None:
        stats["waiting"] = int(waiting)
    if kv_usage is not None:
        stats["kv_usage"] = float(kv_usage)
    return stats
