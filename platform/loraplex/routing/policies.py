"""Which RoutingPolicy a config names: a built-in name, or "module:Class" for any other.

The serving package ships only what production routes with. Comparison policies (bench.routing)
are loaded by import path, so the same router still runs them on real replicas (see
scripts/bench_routing.py); the module must then be importable in every Serve replica.
"""
import importlib

from loraplex.routing.policy import RoutingPolicy
from loraplex.routing.residency import ResidencyAwarePolicy
from loraplex.routing.tenant_affinity import TenantAffinityPolicy

# None: Serve's own power-of-two router places every call; no RoutingPolicy runs.
BUILT_IN: dict[str, type[RoutingPolicy] | None] = {
    TenantAffinityPolicy.name: TenantAffinityPolicy,
    ResidencyAwarePolicy.name: ResidencyAwarePolicy,
    "power_of_two": None,
}


def policy_class(spec: str) -> type[RoutingPolicy] | None:
    """The class a `routing.policy` value names (None for Serve's power of two); ValueError
    says why when it names none."""
    if spec in BUILT_IN:
        return BUILT_IN[spec]
    module, sep, attr = spec.partition(":")
    if not (sep and module and attr):
        raise ValueError(f"unknown routing policy {spec!r}; choose one of {sorted(BUILT_IN)}, "
                         "or name a RoutingPolicy class as 'module:Class'")
    try:
        cls = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"routing policy {spec!r} cannot be loaded ({e}); its module must be "
                         "importable where Serve runs the router (e.g. the repository root on "
                         "PYTHONPATH for bench.routing)") from None
    if not (isinstance(cls, type) and issubclass(cls, RoutingPolicy)):
        raise ValueError(f"routing policy {spec!r} is not a RoutingPolicy subclass")
    return cls
