"""Request routing across engine replicas: pure ranking policies and a trace simulator.

Nothing here imports Ray, so the policies are unit-tested and simulated as plain Python; the
Ray Serve RequestRouter wraps a RoutingPolicy.
"""
from loraplex.routing.bounded_load import load_bound, rank_tenant_affinity
from loraplex.routing.policies import POLICIES, make_policy
from loraplex.routing.policy import RoutingPolicy
from loraplex.routing.prefix_index import chain_hashes
from loraplex.routing.rendezvous import rendezvous_order, rendezvous_weight
from loraplex.routing.snapshot import ReplicaSnapshot, RouteRequest
from loraplex.routing.tenant_affinity import TenantAffinityPolicy

__all__ = [
    "POLICIES", "ReplicaSnapshot", "RouteRequest", "RoutingPolicy", "TenantAffinityPolicy",
    "chain_hashes", "load_bound", "make_policy", "rank_tenant_affinity", "rendezvous_order",
    "rendezvous_weight",
]
