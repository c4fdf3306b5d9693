"""Like SGLang's router cache_aware policy.

When the load is imbalanced, i.e. (max - min) > balance_abs_threshold AND
max > min x balance_rel_threshold, the shortest queue wins. Otherwise the replica with the
longest prefix match wins if the match rate exceeds cache_threshold, else the replica whose
tree is smallest (most room to cache something new). Defaults are sgl-router's.
"""
from collections.abc import Sequence

from bench.routing.prefix_index import PrefixPolicy, PrefixRequest
from loraplex.routing.snapshot import ReplicaSnapshot


class CacheAwarePolicy(PrefixPolicy):
    name = "cache_aware"

    def __init__(self, blocks_per_replica: int = 1 << 20, cache_threshold: float = 0.3,
                 balance_abs_threshold: int = 64, balance_rel_threshold: float = 1.5,
                 **hashing):
        super().__init__(blocks_per_replica, **hashing)
        self.cache_threshold = cache_threshold
        self.balance_abs_threshold = balance_abs_threshold
        self.balance_rel_threshold = balance_rel_threshold

    def rank(self, request: PrefixRequest, replicas: Sequence[ReplicaSnapshot]) -> list[str]:
        by_load = sorted(replicas, key=lambda r: (r.load, r.replica_id))
        ids = [r.replica_id for r in by_load]
        lo, hi = by_load[0].load, by_load[-1].load
        imbalanced = (hi - lo > self.balance_abs_threshold
                      and hi > lo * self.balance_rel_threshold)
        if imbalanced or not request.prefix_hashes:
            return ids
        matched = self.index.match(request.prefix_hashes, ids)
        best = max(matched.values(), default=0)
        if best / len(request.prefix_hashes) > self.cache_threshold:
            # Several replicas can tie on the match; the least loaded of them goes first.
            first = next(r for r in ids if matched.get(r) == best)
        else:
            first = min(ids, key=self.index.size)  # min keeps the least loaded on ties
        return [first] + [r for r in ids if r != first]
