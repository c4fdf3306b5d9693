"""Like Ray Serve's PrefixCacheAffinityRouter: prefix match when the match rate is high enough.

Ray's flow: if queue lengths differ by more than imbalanced_threshold (default: infinite, i.e.
never), fall back to power of two; otherwise the replicas with the longest prefix match, if the
match rate reaches match_rate_threshold, else the replicas whose trees are smallest; Serve then
takes the least loaded of those candidates.
"""
import math
from collections.abc import Sequence

from bench.routing.baselines import PowerOfTwoPolicy
from bench.routing.prefix_index import PrefixPolicy, PrefixRequest
from loraplex.routing.snapshot import ReplicaSnapshot


class PrefixTreePolicy(PrefixPolicy):
    name = "prefix_tree"

    def __init__(self, blocks_per_replica: int = 1 << 20, match_rate_threshold: float = 0.1,
                 imbalanced_threshold: float = math.inf, seed: int | None = None, **hashing):
        super().__init__(blocks_per_replica, **hashing)
        self.match_rate_threshold = match_rate_threshold
        self.imbalanced_threshold = imbalanced_threshold
        self._fallback = PowerOfTwoPolicy(seed)

    def rank(self, request: PrefixRequest, replicas: Sequence[ReplicaSnapshot]) -> list[str]:
        by_load = sorted(replicas, key=lambda r: (r.load, r.replica_id))
        spread = by_load[-1].load - by_load[0].load
        if not request.prefix_hashes or spread > self.imbalanced_threshold:
            return self._fallback.rank(request, replicas)
        ids = [r.replica_id for r in by_load]
        matched = self.index.match(request.prefix_hashes, ids)
        best = max(matched.values(), default=0)
        if best / len(request.prefix_hashes) >= self.match_rate_threshold:
            chosen = {r for r, n in matched.items() if n == best}
        else:
            smallest = min(self.index.size(r) for r in ids)
            chosen = {r for r in ids if self.index.size(r) == smallest}
        # Serve takes the least loaded candidate; the others stay as a fallback.
        return [r for r in ids if r in chosen] + [r for r in ids if r not in chosen]
