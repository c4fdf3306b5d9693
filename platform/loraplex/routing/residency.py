"""ResidencyAwarePolicy: tenant affinity that also knows where each adapter is resident.

vLLM runs a batch with at most `max_loras` distinct adapters (GPU slots); an adapter that is not
in a slot waits for one, and swapping it in costs a copy from the CPU tier (`max_cpu_loras`,
host memory) or a load from disk when it is not there either. Tenant affinity keeps a key on the
replica that served it, but nothing stops a replica from collecting more active adapters than
it has slots while another has slots free. This policy ranks an adapter request by, in order:

1. the replicas *warm* for it (the adapter in a GPU slot or the CPU tier, or the router saw its
   key there: its prompts' prefix cache) that fit under the load bound (c x the mean), best
   score first (slot 2, CPU tier 1, cold 0; + 1 for prefix affinity), then least loaded;
2. cold replicas under the new-key bound (c_new x the mean) with a free slot (fewer distinct
   active adapters than max_loras), fewest active adapters first, then rendezvous order;
3. cold replicas under the new-key bound without a free slot, fewest active adapters first;
4. the other replicas under the bound, rendezvous order; 5. the rest, least loaded first.

A hot adapter may spread: its share of all adapter demand (the engines' decayed request counts,
summed over the pool) entitles it to ceil(share x replicas) replicas, and while fewer are warm
for it the cold replicas of step 2 compete with step 1 on load. A cold adapter (share below
1/replicas) stays on the one replica that holds it while that replica is under the bound.
Requests on the base model rank as TenantAffinityPolicy ranks them. Every input is plain data
(ReplicaSnapshot, what the router routed lately), so ingress replicas rank alike and the
simulator (bench/routing/adapter_sim.py) runs the same code.
"""
from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from loraplex.routing.bounded_load import load_bound
from loraplex.routing.rendezvous import rendezvous_order
from loraplex.routing.policy import RoutingSettings
from loraplex.routing.snapshot import ReplicaSnapshot, RouteRequest
from loraplex.routing.tenant_affinity import TenantAffinityPolicy

if TYPE_CHECKING:
    from loraplex.contract import EngineCall

SLOT, CPU_TIER, COLD = 2, 1, 0
# Demand (decayed requests) at which a reported adapter counts as active on its replica.
ACTIVE_DEMAND = 0.5


def residency(replica: ReplicaSnapshot, key: str) -> int:
    if replica.slot_adapters is not None and key in replica.slot_adapters:
        return SLOT
    if replica.cpu_adapters is not None and key in replica.cpu_adapters:
        return CPU_TIER
    return COLD


def adapter_spread(key: str, replicas: Sequence[ReplicaSnapshot]) -> int:
    """How many replicas the adapter's share of the pool's adapter demand entitles it to (>= 1)."""
    total = sum(sum(r.adapter_demand.values()) for r in replicas)
    if total <= 0:
        return 1
    mine = sum(r.adapter_demand.get(key, 0.0) for r in replicas)
    return max(1, min(len(replicas), math.ceil(mine / total * len(replicas) - 1e-9)))


def rank_residency_aware(request: RouteRequest, replicas: Sequence[ReplicaSnapshot], holders: set[str],
                         active: Mapping[str, set[str]], c: float, c_new: float | None, min_bound: int = 0,
                         default_max_loras: int = 0) -> list[str]:
    """All replica ids, best first, for an adapter request (see the module docstring).
    `active`: each replica's distinct active adapters (keys); `holders`: the replicas that
    hold the key's prefix; default_max_loras stands in for a replica that did not report its slots."""
    by_id = {r.replica_id: r for r in replicas}
    loads = {r.replica_id: r.load for r in replicas}
    order = rendezvous_order(request.key, loads)
    if not order:
        return []
    total, n = sum(loads.values()), len(order)
    bound = load_bound(total, n, c, min_bound)
    new_bound = bound if c_new is None or c_new >= c else load_bound(total, n, c_new, min_bound)
    key = request.key

    def score(r: str) -> int:
        return residency(by_id[r], key) + (1 if r in holders else 0)

    def least_loaded(r: str) -> tuple[int, float]:
        return loads[r], by_id[r].kv_usage

    def active_count(r: str) -> int:
        return len(active.get(r, set()) - {key})

    def free_slot(r: str) -> bool:
        slots = by_id[r].max_loras or default_max_loras
        return slots <= 0 or active_count(r) < slots

    fits = [r for r in order if loads[r] + 1 <= bound]
    warm = [r for r in fits if score(r) > 0]
    cold_roomy = [r for r in fits if score(r) == 0 and loads[r] + 1 <= new_bound]
    free = [r for r in cold_roomy if free_slot(r)]
    crowded = [r for r in cold_roomy if not free_slot(r)]
    warm_anywhere = sum(1 for r in order if score(r) > 0)
    if warm_anywhere < adapter_spread(key, replicas):
        # Entitled to another replica: the free cold ones compete with the warm ones on load.
        first = sorted(warm + free, key=lambda r: (loads[r], -score(r), active_count(r), by_id[r].kv_usage))
        free = []
    else:
        first = sorted(warm, key=lambda r: (-score(r), *least_loaded(r)))
    free = sorted(free, key=active_count)  # stable: rendezvous order among equals
    crowded = sorted(crowded, key=lambda r: (active_count(r), loads[r]))
    placed = set(first) | set(free) | set(crowded)
    rest = [r for r in fits if r not in placed]
    over = sorted((r for r in order if loads[r] + 1 > bound), key=least_loaded)
    return first + free + crowded + rest + over


class ResidencyAwarePolicy(TenantAffinityPolicy):
    """Options: those of TenantAffinityPolicy, plus active_window_s (an adapter this router sent
    to a replica counts as active there this long, until the engine's report says so) and
    max_loras (the engines' slot count, for replicas that have not reported it)."""

    name = "residency_aware"

    def __init__(self, *args, active_window_s: float = 30.0, max_loras: int = 0,
                 clock: Callable[[], float] = time.monotonic, **kwargs):
        super().__init__(*args, **kwargs)
        self.active_window_s = active_window_s
        self.max_loras = max_loras
        self.clock = clock
        self._routed: dict[str, OrderedDict[str, float]] = {}  # replica -> adapter key -> when

    @classmethod
    def from_config(cls, config: RoutingSettings) -> ResidencyAwarePolicy:
        return cls(**{"c": config.load_factor, "c_new": config.new_key_load_factor,
                      "min_bound": config.min_bound, "keys_per_replica": config.keys_per_replica,
                      "tokens_per_replica": config.tokens_per_replica, **config.policy_options})

    def route(self, call: EngineCall, request) -> RouteRequest:
        return RouteRequest(call.routing_key, call.prompt_tokens, adapter=call.adapter is not None)

    def rank(self, request: RouteRequest, replicas: Sequence[ReplicaSnapshot]) -> list[str]:
        if not request.adapter:
            return super().rank(request, replicas)
        return rank_residency_aware(request, replicas, self.holders(request, replicas),
                                    self.active_adapters(replicas), self.c, self.c_new, self.min_bound,
                                    self.max_loras)

    def active_adapters(self, replicas: Sequence[ReplicaSnapshot]) -> dict[str, set[str]]:
        """Per replica: adapters in its slots, those its engine reports demand for, and those
        this router sent there within active_window_s."""
        horizon = self.clock() - self.active_window_s
        out = {}
        for r in replicas:
            routed = self._routed.get(r.replica_id, OrderedDict())
            while routed and next(iter(routed.values())) < horizon:
                routed.popitem(last=False)
            out[r.replica_id] = (set(r.slot_adapters or ()) | set(routed)
                                 | {k for k, d in r.adapter_demand.items() if d >= ACTIVE_DEMAND})
        return out

    def on_routed(self, request: RouteRequest, replica_id: str) -> None:
        super().on_routed(request, replica_id)
        if request.adapter:
            routed = self._routed.setdefault(replica_id, OrderedDict())
            routed.pop(request.key, None)
            routed[request.key] = self.clock()

    def on_replica_removed(self, replica_id: str) -> None:
        super().on_replica_removed(replica_id)
        self._routed.pop(replica_id, None)
