import pytest

from loraplex.contract import EngineCall
from loraplex.routing.config import RoutingConfig
from loraplex.routing.policies import policy_class
from loraplex.routing.policy import RoutingPolicy
from loraplex.routing.rendezvous import rendezvous_order
from loraplex.routing.snapshot import ReplicaSnapshot, RouteRequest
from loraplex.routing.tenant_affinity import TenantAffinityPolicy


def snaps(*loads, waiting=None):
    waiting = waiting or [0] * len(loads)
    return [ReplicaSnapshot(f"r{i}", in_flight=n, waiting=w)
            for i, (n, w) in enumerate(zip(loads, waiting))]


def test_a_policy_routes_by_the_calls_key_and_prompt_estimate():
    call = EngineCall("req-1", "acme", routing_key="acme/bot", prompt_tokens=120, max_tokens=9)
    assert RoutingPolicy().route(call, request=None) == RouteRequest("acme/bot", 120)


def test_config_names_built_in_policies_or_import_paths():
    assert policy_class("tenant_affinity") is TenantAffinityPolicy
    assert policy_class("power_of_two") is None  # Serve's own router
    assert policy_class("loraplex.routing.tenant_affinity:TenantAffinityPolicy") is (
        TenantAffinityPolicy)
    assert RoutingConfig(policy="power_of_two").make_policy() is None
    policy = RoutingConfig(load_factor=1.5, min_bound=2,
                           policy_options={"c_new": None}).make_policy()
    assert (policy.c, policy.c_new, policy.min_bound) == (1.5, None, 2)


@pytest.mark.parametrize("policy, error", [
    ("fastest", "unknown routing policy 'fastest'; choose one of"),
    ("no.such.module:Policy", "cannot be loaded"),
    ("loraplex.routing.policy:NoSuchPolicy", "cannot be loaded"),
    ("loraplex.routing.snapshot:RouteRequest", "is not a RoutingPolicy subclass"),
])
def test_config_rejects_what_names_no_policy(policy, error):
    with pytest.raises(ValueError, match=error):
        RoutingConfig(policy=policy)


def test_config_rejects_options_its_policy_does_not_take():
    with pytest.raises(ValueError, match="fastest"):
        RoutingConfig(policy_options={"fastest": True})
    with pytest.raises(ValueError, match="takes no policy_options"):
        RoutingConfig(policy="power_of_two", policy_options={"seed": 1})


def test_tenant_affinity_remembers_routed_keys_until_the_replica_goes():
    policy = TenantAffinityPolicy()
    replicas = snaps(0, 0, 0, 0)
    second = rendezvous_order("acme", [r.replica_id for r in replicas])[1]
    policy.on_routed(RouteRequest("acme"), second)
    assert policy.rank(RouteRequest("acme"), replicas)[0] == second
    policy.on_replica_removed(second)
    assert policy.rank(RouteRequest("acme"), replicas)[0] != second


def test_tenant_affinity_uses_engine_reports():
    policy = TenantAffinityPolicy()
    ids = [f"r{i}" for i in range(4)]
    last = rendezvous_order("acme/bot", ids)[-1]
    replicas = snaps(0, 0, 0, 0)
    replicas[ids.index(last)].held_keys = frozenset({"acme/bot"})
    assert policy.rank(RouteRequest("acme/bot"), replicas)[0] == last


def test_engine_stats_replace_what_the_router_believed():
    policy = TenantAffinityPolicy()
    ids = [f"r{i}" for i in range(4)]
    last = rendezvous_order("acme", ids)[-1]
    policy.on_routed(RouteRequest("acme"), last)
    assert policy.rank(RouteRequest("acme"), snaps(0, 0, 0, 0))[0] == last
    policy.on_stats(last, ["other"])  # the engine evicted acme's adapter
    assert policy.rank(RouteRequest("acme"), snaps(0, 0, 0, 0))[0] == rendezvous_order(
        "acme", ids)[0]


def test_tenant_affinity_forgets_least_recent_keys_beyond_its_estimate():
    policy = TenantAffinityPolicy(keys_per_replica=2)
    for key in ("a", "b", "c"):
        policy.on_routed(RouteRequest(key), "r0")
    assert policy.held.holders("a") == set()
    assert policy.held.holders("c") == {"r0"}


def test_tenant_affinity_counts_an_engines_waiting_requests_as_load():
    policy = TenantAffinityPolicy(min_bound=0)
    ids = [f"r{i}" for i in range(4)]
    home = rendezvous_order("acme", ids)[0]
    assert policy.rank(RouteRequest("acme"), snaps(1, 1, 1, 1))[0] == home
    waiting = [4 if r == home else 0 for r in ids]  # 1 + 4 > ceil(1.25 x (8 + 1) / 4) = 3
    assert policy.rank(RouteRequest("acme"), snaps(1, 1, 1, 1, waiting=waiting))[0] != home


def test_tenant_affinity_breaks_load_ties_on_kv_usage():
    policy = TenantAffinityPolicy()
    replicas = snaps(0, 0, 0, 0)
    ids = [r.replica_id for r in replicas]
    order = rendezvous_order("acme", ids)
    for r in order[:2]:
        policy.on_stats(r, ["acme"])  # one stats round: both hold it, equally long
    assert policy.rank(RouteRequest("acme"), replicas)[:2] == order[:2]  # rendezvous order
    replicas[ids.index(order[0])].kv_usage = 0.9
    assert policy.rank(RouteRequest("acme"), replicas)[:2] == [order[1], order[0]]


def test_tenant_affinity_keeps_a_key_on_its_first_holder_after_a_spill():
    policy = TenantAffinityPolicy()
    replicas = snaps(0, 0)
    first, joined = [r.replica_id for r in replicas]
    policy.on_routed(RouteRequest("acme"), first)
    policy.on_routed(RouteRequest("acme"), joined)  # spilled while the first one was full
    assert policy.rank(RouteRequest("acme"), snaps(1, 0))[0] == first  # room again: back home
    policy.on_stats(first, ["acme"])  # reports keep the age
    assert policy.rank(RouteRequest("acme"), snaps(1, 0))[0] == first


def test_tenant_affinity_places_a_new_key_only_where_there_is_room_to_spare():
    ids = [f"r{i}" for i in range(10)]
    order = rendezvous_order("acme", ids)
    loads = [1 if r in order[:8] else 0 for r in ids]  # 8 in flight on 10 replicas
    # Bound ceil(1.25 x 9 / 10) = 2, new-key bound ceil(1.1 x 9 / 10) = 1: acme's first choices
    # (1 in flight) fit the bound, but only the idle ones have room for a key they do not hold.
    assert TenantAffinityPolicy().rank(RouteRequest("acme"), snaps(*loads))[:3] == [
        order[8], order[9], order[0]]
    assert TenantAffinityPolicy(c_new=None).rank(RouteRequest("acme"), snaps(*loads))[0] == order[0]


def test_tenant_affinity_remembers_by_prompt_tokens_within_its_token_budget():
    policy = TenantAffinityPolicy(tokens_per_replica=1000)
    policy.on_routed(RouteRequest("a", 600), "r0")
    policy.on_routed(RouteRequest("b", 300), "r0")
    assert policy.held.holders("a") == {"r0"}  # 900 tokens fit
    policy.on_routed(RouteRequest("c", 300), "r0")
    assert policy.held.holders("a") == set() and policy.held.keys("r0") == ["b", "c"]
