"""TenantAffinityPolicy: rank_tenant_affinity plus the router's memory of who holds what."""
from __future__ import annotations

from collections.abc import Iterable, Sequence

from loraplex.routing.bounded_load import (DEFAULT_LOAD_FACTOR, DEFAULT_NEW_KEY_LOAD_FACTOR,
                                           rank_tenant_affinity)
from loraplex.routing.held_keys import HeldKeys
from loraplex.routing.policy import RoutingPolicy, RoutingSettings
from loraplex.routing.snapshot import ReplicaSnapshot, RouteRequest


class TenantAffinityPolicy(RoutingPolicy):
    """Options:

    c: the load bound, c x the mean load (held keys may fill up to it);
    c_new: the bound for placing a key on a replica that does not hold it (None: c);
    min_bound: a floor on both bounds, so a nearly idle pool keeps keys together;
    keys_per_replica / tokens_per_replica: how much the router remembers per replica (see
    HeldKeys); tokens_per_replica is the replica's prefix-cache capacity in tokens.
    A replica's load is ReplicaSnapshot.load (in flight, plus what its engine queues); its KV
    usage breaks ties between equally loaded replicas. A key's holders go longest holder first.
    """

    name = "tenant_affinity"

    def __init__(self, c: float = DEFAULT_LOAD_FACTOR,
                 c_new: float | None = DEFAULT_NEW_KEY_LOAD_FACTOR, min_bound: int = 0,
                 keys_per_replica: int | None = None, tokens_per_replica: int | None = None):
        self.c = c
        self.c_new = c_new
        self.min_bound = min_bound
        self.held = HeldKeys(keys_per_replica, tokens_per_replica)

    @classmethod
    def from_config(cls, config: RoutingSettings) -> TenantAffinityPolicy:
        return cls(**{"c": config.load_factor, "c_new": config.new_key_load_factor,
                      "min_bound": config.min_bound, "keys_per_replica": config.keys_per_replica,
                      "tokens_per_replica": config.tokens_per_replica, **config.policy_options})

    def rank(self, request: RouteRequest, replicas: Sequence[ReplicaSnapshot]) -> list[str]:
        loads = {r.replica_id: r.load for r in replicas}
        return rank_tenant_affinity(request.key, loads, self.holders(request, replicas), self.c, self.min_bound,
                                    self.c_new, {r.replica_id: r.kv_usage for r in replicas},
                                    self.held.since(request.key))

    def holders(self, request: RouteRequest, replicas: Sequence[ReplicaSnapshot]) -> set[str]:
        tracked = self.held.holders(request.key)
        # A fresh engine report counts too: the router may not have routed that key there.
        return {r.replica_id for r in replicas
                if r.replica_id in tracked
                or (r.held_keys is not None and request.key in r.held_keys)}

    def on_routed(self, request: RouteRequest, replica_id: str) -> None:
        self.held.add(replica_id, request.key, request.prompt_tokens)

    def on_replica_removed(self, replica_id: str) -> None:
        self.held.remove_replica(replica_id)

    def on_stats(self, replica_id: str, held_keys: Iterable[str]) -> None:
        self.held.replace(replica_id, held_keys)
