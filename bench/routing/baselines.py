"""Load-only and hash-only policies to compare tenant affinity against."""
import random
from collections.abc import Sequence

from loraplex.routing.policy import RoutingPolicy
from loraplex.routing.rendezvous import rendezvous_order
from loraplex.routing.snapshot import ReplicaSnapshot, RouteRequest


class PowerOfTwoPolicy(RoutingPolicy):
    """Ray Serve's default: sample two replicas, prefer the one with the shorter queue. The
    simulator's model of it; on real replicas `power_of_two` is Serve's own router."""

    name = "power_of_two"

    def __init__(self, seed: int | None = None):
        self._rng = random.Random(seed)

    def rank(self, request: RouteRequest, replicas: Sequence[ReplicaSnapshot]) -> list[str]:
        pair = self._rng.sample(list(replicas), min(2, len(replicas)))
        return [r.replica_id for r in sorted(pair, key=lambda r: r.load)]


class RoundRobinPolicy(RoutingPolicy):
    name = "round_robin"

    def __init__(self):
        self._next = 0

    def rank(self, request: RouteRequest, replicas: Sequence[ReplicaSnapshot]) -> list[str]:
        # Sorted ids make the rotation independent of the order the caller lists replicas in.
        ids = sorted(r.replica_id for r in replicas)
        if not ids:
            return []
        start = self._next % len(ids)
        self._next += 1
        return ids[start:] + ids[:start]


class LeastPendingTokensPolicy(RoutingPolicy):
    """Fewest queued + running tokens first: balances work, not request counts."""

    name = "least_pending_tokens"

    def rank(self, request: RouteRequest, replicas: Sequence[ReplicaSnapshot]) -> list[str]:
        return [r.replica_id for r in sorted(replicas, key=lambda r: (r.pending_tokens, r.load,
                                                                    r.replica_id))]


class StickyHashPolicy(RoutingPolicy):
    """Every key to its first rendezvous replica, whatever the load: the hit-rate upper bound."""

    name = "sticky_hash"

    def rank(self, request: RouteRequest, replicas: Sequence[ReplicaSnapshot]) -> list[str]:
        return rendezvous_order(request.key, (r.replica_id for r in replicas))
