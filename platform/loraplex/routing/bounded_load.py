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
# How many requests (a share of the mean load, at least 1) a key's longest holder may carry
# over its least loaded holder and still be chosen (see rank_tenant_affinity).
DEFAULT_HOLD_SLACK = 0.05


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
                         kv_usage: Mapping[str, float] | None = None,
                         held_since: Mapping[str, float] | None = None,
                         hold_slack: float = DEFAULT_HOLD_SLACK) -> list[str]:
    """All replica ids, best first, for a request with affinity key `key`.

    1. replicas that already hold the key and fit under the bound, least loaded first, except
       that the holders within max(1, hold_slack x the mean) requests of the least loaded one
       go longest holder first (held_since: smaller is older; missing counts as newest);
    2. the other replicas that fit under the new-key bound (c_new x the mean), in the key's
       rendezvous order;
    3. the other replicas under the bound, in the key's rendezvous order;
    4. the replicas over the bound, least loaded first.
    c_new (None: c; never above c) is for keys the replica does not hold yet: such a request
    misses wherever it goes, so placing it only where there is room to spare balances the pool
    at no cost in hits, while held keys may use the whole bound to stay where they are cached.
    The slack is for a pool that grows: a key that spilled onto a replica that joined returns
    to its first replica while the two carry about as much, instead of following every small
    difference in load to the newcomer. It is kept small because filling the longest holder
    further costs hits: in scripts/route_sim.py, longest holder first up to the bound lost
    0.6-1 point of hit rate and went past 1.25 x the mean, slack 0.05 loses at most 0.3 points.
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
    if held and held_since:
        # Holders within the slack of the least loaded one go longest holder first.
        slack = max(1, int(hold_slack * total / n))
        near = sorted((r for r in held if loads[r] <= loads[held[0]] + slack),
                      key=lambda r: held_since.get(r, math.inf))  # stable: least loaded among equals
        held = near + [r for r in held if r not in near]
    roomy = [r for r in fits if r not in holders and loads[r] + 1 <= new_bound]
    rest = [r for r in fits if r not in holders and loads[r] + 1 > new_bound]
    over = sorted((r for r in order if loads[r] + 1 > bound), key=least_loaded)
    return held + roomy + rest + over
