"""The routing-stats contract between Engine replicas and routers.

Serve calls `record_routing_stats()` on every replica each `request_routing_stats_period_s`
and hands the dict to every router as `RunningReplica.routing_stats`. The Engine builds it with
`routing_stats`; the router reads it with `EngineReport.of`. Every field is optional:

    {
      "held_keys": ["ten_a/bot", "ten_b", ...],  # affinity keys, most recently served first
      "running": 3,      # requests in the engine's batch
      "waiting": 0,      # requests queued in the engine (no batch slot or KV blocks yet)
      "kv_usage": 0.42,  # fraction of the KV cache in use
      "queued": 5,       # requests held in the replica's fair queue (not yet in vLLM)
      "status": {...},   # for /admin/replicas only: the fair queue's snapshot, loaded adapters
      "adapters": {      # where this replica's vLLM holds adapters, by affinity key (tenant/name)
        "slots": ["ten_a/bot"],          # in its GPU slots: a batch runs them without a swap
        "cpu": ["ten_a/bot", "ten_b/x"], # in its CPU tier (host memory): a swap, not a load
        "demand": {"ten_a/bot": 12.5},   # requests lately (decayed count, see KeyDemand)
        "max_loras": 4,                  # its GPU slots
      },
    }

The router takes held_keys as the truth for that replica (keeping keys it routed there since
the report), which drops keys the engine evicted and teaches every ingress replica the keys
the others routed. waiting and queued add to the replica's load, kv_usage breaks ties between equally
loaded replicas, and running + waiting stand in for a queue-length probe the replica missed
(see ReplicaSnapshot, rank_tenant_affinity, TenantAffinityRouter). adapters feeds the
residency-aware policy (routing/residency.py); policies that ignore it lose nothing. The dict
travels through the controller to every router, so held_keys (and each adapters list) is capped
(max_keys).
"""
import math
import time
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

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

    def recent(self) -> list[str]:
        """The keys, most recently served first."""
        return list(reversed(self._keys))

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, key: object) -> bool:
        return key in self._keys


class KeyDemand:
    """Recent requests per affinity key: a count that decays with time constant `tau_s`, so a
    key's value is about its requests in the last tau_s seconds, kept in O(1) per request."""

    def __init__(self, tau_s: float = 60.0, capacity: int = DEFAULT_SERVED_KEYS):
        self.tau_s = tau_s
        self.capacity = capacity
        self._counts: dict[str, tuple[float, float]] = {}  # key -> (value, at)

    def touch(self, key: str | None, now: float | None = None) -> None:
        if key is None:
            return
        now = time.monotonic() if now is None else now
        value, at = self._counts.pop(key, (0.0, now))
        self._counts[key] = (value * math.exp(-(now - at) / self.tau_s) + 1.0, now)
        if len(self._counts) > self.capacity:
            self._counts.pop(next(iter(self._counts)))  # the least recently touched

    def snapshot(self, now: float | None = None) -> dict[str, float]:
        now = time.monotonic() if now is None else now
        return {k: round(v * math.exp(-(now - at) / self.tau_s), 3) for k, (v, at) in self._counts.items()}


def adapter_stats(slots: Iterable[str], cpu: Iterable[str], demand: Mapping[str, float],
                  max_loras: int, max_keys: int = DEFAULT_MAX_REPORTED_KEYS) -> dict:
    """The `adapters` entry of the routing stats (see the module docstring)."""
    return {"slots": sorted(slots)[:max_keys], "cpu": sorted(cpu)[:max_keys],
            "demand": dict(sorted(demand.items(), key=lambda kv: -kv[1])[:max_keys]), "max_loras": int(max_loras)}


def routing_stats(held_keys: Iterable[str], running: int | None = None,
                  waiting: int | None = None, kv_usage: float | None = None,
                  max_keys: int = DEFAULT_MAX_REPORTED_KEYS, queued: int | None = None,
                  status: dict | None = None, adapters: dict | None = None) -> dict:
    """The dict an Engine replica's record_routing_stats() returns (see the module docstring).

    held_keys go most recent first and are cut at max_keys; unknown numbers are left out;
    `adapters` is an adapter_stats() dict.
    """
    stats: dict = {"held_keys": [k for _, k in zip(range(max_keys), held_keys)]}
    if running is not None:
        stats["running"] = int(running)
    if waiting is not None:
        stats["waiting"] = int(waiting)
    if kv_usage is not None:
        stats["kv_usage"] = float(kv_usage)
    if queued is not None:
        stats["queued"] = int(queued)
    if status is not None:
        stats["status"] = status
    if adapters is not None:
        stats["adapters"] = adapters
    return stats


@dataclass(frozen=True)
class AdapterReport:
    """The `adapters` entry as the router reads it."""

    slots: frozenset[str] = frozenset()
    cpu: frozenset[str] = frozenset()
    demand: Mapping[str, float] = field(default_factory=dict)
    max_loras: int = 0  # 0: unknown

    @classmethod
    def of(cls, entry: Any) -> "AdapterReport | None":
        if not isinstance(entry, dict):
            return None

        def keys(v: Any) -> frozenset[str]:
            return frozenset(k for k in v if isinstance(k, str)) if isinstance(v, list) else frozenset()
        demand = entry.get("demand")
        return cls(slots=keys(entry.get("slots")), cpu=keys(entry.get("cpu")),
                   demand={k: float(v) for k, v in demand.items() if isinstance(k, str) and isinstance(v, (int, float))}
                   if isinstance(demand, dict) else {},
                   max_loras=_count(entry.get("max_loras")))


@dataclass(frozen=True)
class EngineReport:
    """One replica's routing stats as the router reads them; absent or malformed numbers are 0."""

    held_keys: tuple[str, ...] | None = None  # most recent first; None: not reported
    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0
    queued: int = 0  # in the replica's fair queue: waiting like `waiting`, only in front of vLLM
    adapters: AdapterReport | None = None  # None: not reported

    @classmethod
    def of(cls, stats: Any) -> "EngineReport | None":
        """The report in a routing-stats dict; None when there is none (not a dict, or empty)."""
        if not isinstance(stats, dict) or not stats:
            return None
        held = stats.get("held_keys")
        return cls(
            held_keys=tuple(k for k in held if isinstance(k, str))
            if isinstance(held, list) else None,
            running=_count(stats.get("running")),
            waiting=_count(stats.get("waiting")),
            kv_usage=float(kv) if isinstance(kv := stats.get("kv_usage"), (int, float)) else 0.0,
            queued=_count(stats.get("queued")),
            adapters=AdapterReport.of(stats.get("adapters")),
        )


def _count(value: Any) -> int:
    return max(int(value), 0) if isinstance(value, (int, float)) else 0


# -- the last report of each replica, as GET /admin/replicas shows it -----------------------------
# Here, not in serve_router: Serve pickles a request router's module by value
# (RequestRouterConfig._serialize_request_router_cls), so a dict global there becomes a copy of
# its own inside the router that the ingress's code never sees. Module functions here are
# pickled by reference: the router and the ingress share this one dict.
_LAST_STATUS: dict[str, dict] = {}


def record_status(replica_uid: str, status: dict) -> None:
    _LAST_STATUS[replica_uid] = status


def forget_status(replica_uid: str) -> None:
    _LAST_STATUS.pop(replica_uid, None)


def replica_statuses() -> list[dict]:
    """Each Engine replica as its last routing stats described it (see Engine.status)."""
    return [dict(v) for _, v in sorted(_LAST_STATUS.items())]
