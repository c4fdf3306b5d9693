"""Policy names, as config selects them, mapped to their classes."""
from loraplex.routing.baselines import (LeastPendingTokensPolicy, PowerOfTwoPolicy,
                                        RoundRobinPolicy, StickyHashPolicy)
from loraplex.routing.cache_aware import CacheAwarePolicy
from loraplex.routing.policy import RoutingPolicy
from loraplex.routing.prefix_tree import PrefixTreePolicy
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
