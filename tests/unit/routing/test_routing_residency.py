"""ResidencyAwarePolicy on fake replica stats: residency (slot > CPU tier > cold), prefix
affinity and load together; distinct adapters spread so each replica stays within max_loras;
a hot adapter spreads by its demand, a cold one stays on one replica."""

from __future__ import annotations

from loraplex.contract import AdapterTarget, EngineCall
from loraplex.routing.config import RoutingConfig
from loraplex.routing.residency import ResidencyAwarePolicy, adapter_spread
from loraplex.routing.served_keys import AdapterReport, EngineReport, adapter_stats, routing_stats
from loraplex.routing.snapshot import ReplicaSnapshot, RouteRequest


def replica(rid: str, load: int = 0, slots=(), cpu=(), demand=None, max_loras: int = 4, **kw) -> ReplicaSnapshot:
    return ReplicaSnapshot(rid, in_flight=load, slot_adapters=frozenset(slots),
                           cpu_adapters=frozenset(set(cpu) | set(slots)), max_loras=max_loras,
                           adapter_demand=demand or {}, **kw)


def adapter(key: str, prompt_tokens: int = 100) -> RouteRequest:
    return RouteRequest(key, prompt_tokens, adapter=True)


def policy(**kw) -> ResidencyAwarePolicy:
    clock = kw.pop("clock", None)
    p = ResidencyAwarePolicy(min_bound=4, **kw)
    if clock is not None:
        p.clock = clock
    return p


def test_slot_beats_cpu_tier_beats_cold_at_equal_load():
    replicas = [replica("cold"), replica("cpu", cpu={"t/a"}), replica("slot", slots={"t/a"})]
    assert policy().rank(adapter("t/a"), replicas)[:2] == ["slot", "cpu"]
    assert policy().rank(adapter("t/a"), replicas[:2])[0] == "cpu"


def test_prefix_affinity_adds_to_residency():
    """Both in the CPU tier: the one whose prefix cache holds the key goes first."""
    replicas = [replica("a", cpu={"t/a"}), replica("b", cpu={"t/a"}, held_keys=frozenset({"t/a"}))]
    assert policy().rank(adapter("t/a"), replicas)[0] == "b"


def test_load_bound_wins_over_residency():
    """The adapter's slot is on a replica past c x the mean: a replica with room takes it."""
    replicas = [replica("slot", load=20, slots={"t/a"}), replica("cold", load=2)]
    assert policy().rank(adapter("t/a"), replicas)[0] == "cold"


def test_a_new_adapter_goes_where_a_slot_is_free():
    """Replica x has four distinct active adapters (its max_loras): a fifth would wait for a
    slot there, so it goes to y, which has one, whatever the rendezvous order says."""
    full = {f"t/{i}" for i in range(4)}
    for key in ("t/new", "u/other", "v/x"):
        replicas = [replica("x", slots=full), replica("y", slots={"t/9"})]
        assert policy().rank(adapter(key), replicas)[0] == "y", key
    # Free slots, not fewer adapters: y runs five but has eight slots, x is full with four.
    five = {f"u/{i}" for i in range(5)}
    for key in ("t/new", "u/other", "v/x"):
        replicas = [replica("x", slots=full), replica("y", slots=five, max_loras=8)]
        assert policy().rank(adapter(key), replicas)[0] == "y", key


def test_distinct_adapters_spread_so_each_replica_stays_within_its_slots():
    """Eight cold adapters, arriving one by one on two idle replicas with four slots each:
    the router's own routing (before any engine report) keeps each replica at four."""
    p = policy(clock=lambda: 0.0)
    replicas = [replica("x"), replica("y")]
    placed = {}
    for i in range(8):
        key = f"t/a{i}"
        placed[key] = p.rank(adapter(key), replicas)[0]
        p.on_routed(adapter(key), placed[key])
    assert sorted(placed.values()) == ["x"] * 4 + ["y"] * 4
    # Each stays where it went (prefix + residency), the cold ones on one replica.
    for key, rid in placed.items():
        assert p.rank(adapter(key), replicas)[0] == rid


def test_active_adapters_expire_after_the_window_unless_reported():
    now = [0.0]
    p = policy(clock=lambda: now[0], active_window_s=30)
    replicas = [replica("x"), replica("y")]
    p.on_routed(adapter("t/a"), "x")
    assert p.active_adapters(replicas)["x"] == {"t/a"}
    now[0] = 31.0
    assert p.active_adapters(replicas)["x"] == set()
    reported = [replica("x", demand={"t/b": 3.0, "t/c": 0.1}), replica("y", slots={"t/d"})]
    assert p.active_adapters(reported) == {"x": {"t/b"}, "y": {"t/d"}}


def test_a_hot_adapter_spreads_by_its_demand_a_cold_one_stays_put():
    """t/hot has 80 % of the pool's adapter demand: ceil(0.8 x 2) = 2 replicas, so the cold
    replica with a free slot takes it when less loaded. t/cold (10 %) stays on its replica."""
    demand = {"t/hot": 40.0, "t/cold": 5.0, "t/x": 5.0}
    replicas = [replica("x", load=3, slots={"t/hot", "t/cold"}, demand=demand), replica("y", load=1)]
    assert adapter_spread("t/hot", replicas) == 2 and adapter_spread("t/cold", replicas) == 1
    assert policy().rank(adapter("t/hot"), replicas)[0] == "y"
    assert policy().rank(adapter("t/cold"), replicas)[0] == "x"
    # Once both are warm for it, residency and load rank them as usual.
    warm = [replicas[0], replica("y", load=1, slots={"t/hot"})]
    assert policy().rank(adapter("t/hot"), warm)[0] == "y"


def test_base_model_requests_rank_as_tenant_affinity():
    from loraplex.routing.tenant_affinity import TenantAffinityPolicy

    replicas = [replica("x", load=1, slots={"t/a"}), replica("y", load=2), replica("z")]
    for key in ("t", "u", "v", "w"):
        assert policy().rank(RouteRequest(key, 10), replicas) == \
            TenantAffinityPolicy(min_bound=4).rank(RouteRequest(key, 10), replicas)


def test_route_marks_adapter_calls_and_the_config_names_the_policy():
    p = RoutingConfig(policy="residency_aware", min_bound=2).make_policy()
    assert isinstance(p, ResidencyAwarePolicy) and p.min_bound == 2
    target = AdapterTarget("t/a@1:s", 3, "t", "a", "s", requested_as="a", version=1)
    assert p.route(EngineCall("r", tenant_id="t", adapter=target, routing_key="t/a"), None).adapter
    assert not p.route(EngineCall("r", tenant_id="t", routing_key="t"), None).adapter


def test_adapter_stats_round_trip_through_the_routing_stats():
    stats = routing_stats(["t/a"], running=1, adapters=adapter_stats({"t/a"}, {"t/a", "t/b"}, {"t/a": 2.5}, 4))
    report = EngineReport.of(stats)
    assert report.adapters == AdapterReport(frozenset({"t/a"}), frozenset({"t/a", "t/b"}), {"t/a": 2.5}, 4)
    assert EngineReport.of({"held_keys": []}).adapters is None  # an engine that does not say
    assert EngineReport.of({"adapters": {"slots": "junk", "demand": {"k": "x"}}}).adapters == AdapterReport()
