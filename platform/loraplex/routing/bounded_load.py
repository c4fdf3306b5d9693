"""The pure tenant-affinity ranking: rendezvous order under Mirrokni et al.'s bounded loads.

"Consistent Hashing with Bounded Loads" (Mirrokni, Thorup, Zadimoghaddam, 2018) caps every
replica at c x the mean load, so a hot key spills onto its next-ranked replicas instead of
melting its first one, while other keys stay where rendezvous hashing puts them. A key goes to a
replica that does not hold it only if that replica is under a tighter bound, c_new x the mean
(see rank_tenant_affinity and docs/route_sim.md).
"""
import math
from collections.abc import Collection, Mapping

from loraplex.routing.rendezvous import rendezvous_order

DEFAULT_LOAD_FACTOR = 1.25
# The bound for placing a key no replica holds yet (see rank_tenant_affinity).
DEFAULT_NEW_KEY_LOAD_FACTOR = 1.1


def load_bound(total_load: int, num_replicas: int, c: float = DEFAULT_LOAD_FACTOR,
               min_bound: int = 0) -> int:
    """Most in-flight requests a replica may hold once the new request is placed.

    The mean counts the new request, and rounding up keeps the bound reachable: the least
    loaded replica always fits (it holds at most floor(total / n) < ceil((total + 1) / n)),
    so for c >= 1 the "else least loaded" fallback only serves replicas a caller filtered.
    min_bound lets a nearly idle pool keep keys together (c x a mean of 0.1 would spread them).
    """
    if num_replicas <= 0:
        raise ValueError("no replicas to bound")
    # The epsilon absorbs float error (1.25 * 8 / 8 must stay 1.25, not round up to 2).
    return max(math.ceil(c * (total_load + 1) / num_replicas - 1e-9), min_bound)


def rank_tenant_affinity(key: str, loads: Mapping[str, int], holders: Collection[str] = (),
                         c: float = DEFAULT_LOAD_FACTOR, min_bound: int = 0,
                         c_new: float | None = None,
                         kv_usage: Mapping[str, float] | None = None) -> list[str]:
    """All replica ids, best first, for a request with affinity key `key`.

    1. replicas that already hold the key and fit under the bound, least loaded first;
    2. the other replicas that fit under the new-key bound (c_new x the mean), in the key's
       rendezvous order;
    3. the other replicas under the bound, in the key's rendezvous order;
    4. the replicas over the bound, least loaded first.
    c_new (None: c; never above c) is for keys the replica does not hold yet: such a request
    misses wherever it goes, so placing it only where there is room to spare balances the pool
    at no cost in hits, while held keys may use the whole bound to stay where they are cached.
    "Least loaded first" breaks ties on kv_usage (fraction of the replica's KV cache in use, as
    its engine last reported; missing: 0): of two replicas with as many requests, the one with
    free KV blocks takes a new prompt without preempting or queueing. Remaining ties keep
    rendezvous order, so the result depends only on the arguments' values.
    """
    order = rendezvous_order(key, loads)
    if not order:
        return []
    total, n = sum(loads.values()), len(order)
    bound = load_bound(total, n, c, min_bound)
    new_bound = bound if c_new is None or c_new >= c else load_bound(total, n, c_new, min_bound)
    kv = kv_usage or {}

    def least_loaded(r: str) -> tuple[int, float]:
        return loads[r], kv.get(r, 0.0)

    fits = [r for r in order if loads[r] + 1 <= bound]
    held = sorted((r for r in fits if r in holders), key=least_loaded)
    roomy = [r for r in fits if r not in holders and loads[r] + 1 <= new_bound]
    rest = [r for r in fits if r not in holders and loads[r] + 1 > new_bound]
    over = sorted((r for r in order if loads[r] + 1 > bound), key=least_loaded)
    return held + roomy + rest + over
