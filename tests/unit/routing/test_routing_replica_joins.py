"""A replica joining moves only the keys it wins (docs/routing.md): the real TenantAffinityRouter,
driven as Serve drives it, with fake replicas at its edge (see test_routing_serve_router)."""

from loraplex.routing.rendezvous import rendezvous_order

from test_routing_serve_router import FakeReplica, fleet, make_router, route, tenant_call

TENANTS = [f"ten_{i}" for i in range(90)]


async def test_a_joining_replica_takes_only_keys_it_wins_and_every_held_key_stays():
    replicas = fleet(3)
    router = make_router(replicas, min_bound=0)
    old_ids = [r.replica_id.unique_id for r in replicas]
    before = {t: await route(router, *tenant_call(t)) for t in TENANTS}
    assert before == {t: rendezvous_order(t, old_ids)[0] for t in TENANTS}
    assert all(router.policy.held.holders(t) == {before[t]} for t in TENANTS)

    joined = FakeReplica("r3")
    router.update_replicas([*replicas, joined])
    ids = [*old_ids, "r3"]
    wins = {t for t in TENANTS if rendezvous_order(t, ids)[0] == "r3"}
    assert 10 <= len(wins) <= 40  # about a quarter of the keys: the test has something to move

    after = {t: await route(router, *tenant_call(t)) for t in TENANTS}
    moved = {t for t in TENANTS if after[t] != before[t]}
    assert moved <= wins and all(after[t] == "r3" for t in moved)
    assert all(after[t] == before[t] for t in TENANTS if t not in wins)  # no key moves between old replicas
    # While its old replica still holds it (cached there), even a key the new replica wins stays.
    assert moved == set()

    # A key nobody holds yet goes to its rendezvous winner, the new replica included.
    fresh = [f"new_{i}" for i in range(40)]
    placed = {t: await route(router, *tenant_call(t)) for t in fresh}
    assert placed == {t: rendezvous_order(t, ids)[0] for t in fresh}
    assert "r3" in placed.values()


async def test_once_the_old_replicas_report_they_dropped_a_key_exactly_the_keys_the_new_one_wins_move():
    replicas = fleet(3)
    router = make_router(replicas, min_bound=0)
    before = {t: await route(router, *tenant_call(t)) for t in TENANTS}

    joined = FakeReplica("r3")
    ids = ["r0", "r1", "r2", "r3"]
    wins = {t for t in TENANTS if rendezvous_order(t, ids)[0] == "r3"}
    # The engines' routing stats (record_routing_stats) say nothing is cached any more.
    for r in replicas:
        r.stats = {"held_keys": [], "running": 0, "waiting": 0}
    router.stats_window_s = 0  # the router's own recent routes are older than the reports
    router.update_replicas([*replicas, joined])
    assert not any(router.policy.held.holders(t) for t in TENANTS)

    after = {t: await route(router, *tenant_call(t)) for t in TENANTS}
    moved = {t for t in TENANTS if after[t] != before[t]}
    assert moved == wins and all(after[t] == "r3" for t in moved)
