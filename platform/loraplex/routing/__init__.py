"""Request routing across engine replicas: the tenant-affinity policy and its Serve router.

Nothing here but loraplex.routing.serve_router imports Ray, so the policy is unit-tested and
simulated as plain Python; the Ray Serve RequestRouter (loraplex.routing.serve_router, imported
by Serve from its path) wraps a RoutingPolicy. The Engine replica reports what it holds with
ServedKeys / routing_stats. Comparison policies and the simulator live in bench.routing.
"""
from loraplex.routing.bounded_load import load_bound, rank_tenant_affinity
from loraplex.routing.config import RoutingConfig
from loraplex.routing.policies import BUILT_IN, policy_class
from loraplex.routing.policy import RoutingPolicy
from loraplex.routing.rendezvous import rendezvous_order, rendezvous_weight
from loraplex.routing.served_keys import EngineReport, ServedKeys, routing_stats
from loraplex.routing.snapshot import ReplicaSnapshot, RouteRequest
from loraplex.routing.tenant_affinity import TenantAffinityPolicy

__all__ = [
    "BUILT_IN", "EngineReport", "ReplicaSnapshot", "RouteRequest", "RoutingConfig",
    "RoutingPolicy", "ServedKeys", "TenantAffinityPolicy", "load_bound", "policy_class",
    "rank_tenant_affinity", "rendezvous_order", "rendezvous_weight", "routing_stats",
]
