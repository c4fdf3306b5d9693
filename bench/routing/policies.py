"""Every policy the benchmarks compare, by name, and how a deployment's config names each."""
from bench.routing.baselines import (LeastPendingTokensPolicy, PowerOfTwoPolicy,
                                     RoundRobinPolicy, StickyHashPolicy)
from bench.routing.cache_aware import CacheAwarePolicy
from bench.routing.prefix_tree import PrefixTreePolicy
from loraplex.routing.policies import BUILT_IN
from loraplex.routing.policy import RoutingPolicy
from loraplex.routing.tenant_affinity import TenantAffinityPolicy

POLICIES: dict[str, type[RoutingPolicy]] = {
    cls.name: cls
    for cls in (TenantAffinityPolicy, PowerOfTwoPolicy, RoundRobinPolicy,
                LeastPendingTokensPolicy, PrefixTreePolicy, CacheAwarePolicy, StickyHashPolicy)
}


def make_policy(name: str, **options) -> RoutingPolicy:
    """A fresh policy; options go to its constructor (e.g. c=1.25 for tenant_affinity)."""
    try:
        cls = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown routing policy {name!r}; choose one of {sorted(POLICIES)}")
    return cls(**options)


def serve_policy(name: str) -> str:
    """The `routing.policy` that runs the policy `name` on real replicas: a built-in name as it
    is (so power_of_two is Serve's own router, not the simulator's model of it), any other by
    import path."""
    if name in BUILT_IN:
        return name
    if name not in POLICIES:
        raise ValueError(f"unknown routing policy {name!r}; choose one of {sorted(POLICIES)}")
    cls = POLICIES[name]
    return f"{cls.__module__}:{cls.__qualname__}"
