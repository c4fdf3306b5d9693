"""Request routing across engine replicas: pure ranking policies and a trace simulator.

Nothing here imports Ray, so the policies are unit-tested and simulated as plain Python; the
Ray Serve RequestRouter (loraplex.routing.serve_router, imported by Serve from its path) wraps a
RoutingPolicy. The Engine replica uses routing_key and ServedKeys / routing_stats to report
what it holds.
"""
from loraplex.routing.bounded_load import load_bound, rank_tenant_affinity
from loraplex.routing.config import RoutingConfig
from loraplex.routing.policies import POLICIES, make_policy
from loraplex.routing.policy import RoutingPolicy
from loraplex.routing.prefix_index import chain_hashes
from loraplex.routing.rendezvous import rendezvous_order, rendezvous_weight
from loraplex.routing.request_key import affinity_key, routing_key
from loraplex.routing.served_keys import ServedKeys, routing_stats
from loraplex.routing.snapshot import ReplicaSnapshot, RouteRequest
from loraplex.routing.tenant_affinity import TenantAffinityPolicy

__all__ = [
    "POLICIES", "ReplicaSnapshot", "RouteRequest", "RoutingConfig", "RoutingPolicy",
    "ServedKeys", "TenantAffinityPolicy", "affinity_key", "chain_hashes", "load_bound",
    "make_policy", "rank_tenant_affinity", "rendezvous_order", "rendezvous_weight",
    "routing_key", "routing_stats",
]
