"""The pure tenant-affinity ranking: rendezvous order under Mirrokni et al.'s bounded loads.

"Consistent Hashing with Bounded Loads" (Mirrokni, Thorup, Zadimoghaddam, 2018) caps every
replica at c x the mean load, so a hot key spills onto its next-ranked replicas instead of
melting its first one, while cold keys stay exactly where rendezvous hashing puts them.
"""
import math
from collections.abc import Collection, Mapping

from loraplex.routing.rendezvous import rendezvous_order

DEFAULT_LOAD_FACTOR = 1.25


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
                         c: float = DEFAULT_LOAD_FACTOR, min_bound: int = 0) -> list[str]:
    """All replica ids, best first, for a request with affinity key `key`.

    1. replicas that already hold the key and fit under the bound, least loaded first;
    2. the other replicas under the bound, in the key's rendezvous order;
    3. the replicas over the bound, least loaded first.
    Ties keep rendezvous order, so the result depends only on the arguments' values.
    """
    order = rendezvous_order(key, loads)
    if not order:
        return []
    bound = load_bound(sum(loads.values()), len(order), c, min_bound)
    fits = [r for r in order if loads[r] + 1 <= bound]
    held = sorted((r for r in fits if r in holders), key=loads.__getitem__)
    fresh = [r for r in fits if r not in holders]
    over = sorted((r for r in order if loads[r] + 1 > bound), key=loads.__getitem__)
    return held + fresh + over
