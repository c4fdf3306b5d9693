"""FairQueue (VTC) and the adaptive dispatch limit, on a fake clock."""

from loraplex.engine.config import AdaptiveLimitConfig, FairQueueConfig
from loraplex.engine.dispatch_limit import AdaptiveLimit, FixedLimit
from loraplex.engine.fair_queue import Entry, FairQueue


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def make(limit=1, max_num_seqs=8, **cfg):
    clock = Clock()
    q = FairQueue(FairQueueConfig(**{"newcomer_slots": 0, **cfg}),
                  limit if not isinstance(limit, int) else FixedLimit(limit), max_num_seqs, clock=clock, wall=clock)
    return q, clock


def entry(tenant, order=None, **kw):
    e = Entry(tenant, **kw)
    if order is not None:
        e.ready = lambda e: order.append(e)
    return e


def run_to_end(q, order, served=None):
    """Finish dispatched entries one at a time, in dispatch order; return the tenants in order."""
    tenants = []
    i = 0
    while i < len(order):
        e = order[i]
        i += 1
        if e.state != "running":
            continue
        tenants.append(e.tenant)
        if served is not None:
            q.charge(e.tenant, 0, served, e.weight)
        q.finish(e)
    return tenants


def test_vtc_serves_the_tenant_with_the_lowest_counter():
    q, _ = make(limit=1)
    order = []
    q.submit(entry("a", order))  # runs
    for _ in range(3):
        q.submit(entry("a", order))
    q.submit(entry("b", order))
    q.charge("a", 10, 10)  # a was served 30 weighted tokens; b nothing
    # b (counter lifted to a's 0 -> then a charged) goes before a's backlog
    assert run_to_end(q, order) == ["a", "b", "a", "a", "a"]


def test_counter_uses_the_token_costs():
    q, _ = make(limit=1, prompt_token_cost=0.0, completion_token_cost=3.0)
    q.submit(entry("a"))
    q.charge("a", 100, 2)
    assert q.tenants["a"].counter == 6.0


def test_alternates_between_backlogged_tenants_of_equal_weight():
    q, _ = make(limit=1)
    order = []
    q.submit(entry("a", order))
    for _ in range(3):
        q.submit(entry("a", order))
        q.submit(entry("b", order))
    assert run_to_end(q, order, served=10) == ["a", "b", "a", "b", "a", "b", "a"]


def test_weights_share_two_to_one():
    q, _ = make(limit=1, max_queued=100)
    order = []
    q.submit(entry("heavy", order, weight=2.0))
    for _ in range(20):
        q.submit(entry("heavy", order, weight=2.0))
        q.submit(entry("light", order, weight=1.0))
    served = run_to_end(q, order, served=10)[:30]
    assert served.count("heavy") == 20 and served.count("light") == 10


def test_a_newcomer_is_lifted_to_the_active_minimum():
    q, _ = make(limit=1)
    order = []
    q.submit(entry("a", order))
    q.charge("a", 0, 500)  # a has been served alone for a long time
    q.submit(entry("a", order))
    q.submit(entry("b", order))
    assert q.tenants["b"].counter == q.tenants["a"].counter == 1000.0
    q.submit(entry("c", order))
    q.charge("b", 0, 5)
    q.submit(entry("d", order))  # lifted to the lowest active counter (a and c: 1000), not b's
    assert q.tenants["d"].counter == 1000.0


def test_idle_time_earns_no_credit():
    q, _ = make(limit=1)
    order = []
    q.submit(entry("b", order))
    q.charge("b", 0, 10)
    q.finish(order[0])  # b served 20, then idle
    q.submit(entry("a", order))
    q.charge("a", 0, 1000)  # a ran alone: 2000
    q.submit(entry("a", order))
    q.submit(entry("b", order))  # b comes back: lifted to 2000, not left at 20
    assert q.tenants["b"].counter == q.tenants["a"].counter == 2000.0


def test_higher_tier_first_then_aging_lets_the_lower_tier_in():
    q, clock = make(limit=1, aging_s=5.0)
    order = []
    q.submit(entry("low", order, priority=0))  # runs
    q.submit(entry("low", order, priority=0))
    q.submit(entry("high", order, priority=100))
    q.charge("high", 0, 1000)  # even with a far higher counter, the tier wins
    q.finish(order[0])
    assert order[-1].tenant == "high"
    # Later: low's request has waited aging_s; it now ranks as the top tier and VTC picks it.
    clock.now += 5.0
    q.submit(entry("high", order, priority=100))
    q.finish(order[-1])
    assert order[-1].tenant == "low"


def test_without_aging_the_lower_tier_waits():
    q, clock = make(limit=1, aging_s=100.0)
    order = []
    q.submit(entry("low", order, priority=0))
    q.submit(entry("low", order, priority=0))
    q.submit(entry("high", order, priority=100))
    q.charge("high", 0, 1000)
    clock.now += 5.0
    q.finish(order[0])
    assert order[-1].tenant == "high"


def test_cancel_removes_a_queued_request_at_once():
    q, _ = make(limit=1)
    order = []
    q.submit(entry("a", order))
    waiting = entry("b", order)
    q.submit(waiting)
    assert q.queued == 1
    q.finish(waiting)  # the client went away while queued
    assert q.queued == 0 and waiting.state == "done"
    q.finish(order[0])
    assert q.running == 0 and waiting not in order


def test_deadline_removes_a_queued_request_and_refuses_late_ones():
    q, clock = make(limit=1, deadline_margin_s=1.0)
    order = []
    q.submit(entry("a", order))
    waiting = entry("b", order, deadline=clock.now + 3.0)
    q.submit(waiting)
    clock.now += 2.0  # within the margin: it cannot start in time
    q.expire()
    assert waiting.state == "refused" and waiting.reason == "queue_deadline" and q.queued == 0
    late = entry("c", order, deadline=clock.now + 0.5)
    q.submit(late)  # it would have to queue: refused at once
    assert late.state == "refused" and late.reason == "queue_deadline"
    q.finish(order[0])
    starts = entry("d", order, deadline=clock.now + 0.5)
    q.submit(starts)  # a free slot: it starts now, however close its deadline
    assert starts.state == "running"


def test_shed_by_share_refuses_the_tenant_furthest_over():
    q, _ = make(limit=1, max_queued=3)
    order = []
    q.submit(entry("w", order))
    q.charge("w", 0, 100)
    flood = [entry("w", order) for _ in range(3)]
    for e in flood:
        q.submit(e)
    assert q.queued == 3
    m = entry("m", order)  # a newcomer with nothing queued: never the one refused
    q.submit(m)
    assert m.state == "queued"
    assert flood[-1].state == "refused" and flood[-1].reason == "fair_share"
    more = entry("w", order)  # w is still the furthest over: its own new request is refused
    q.submit(more)
    assert more.state == "refused"
    assert q.refused["fair_share"] == 2


def test_shed_refuses_the_lowest_tier_first():
    q, _ = make(limit=1, max_queued=2)
    order = []
    q.submit(entry("x", order))
    low = entry("low", order, priority=0)
    q.submit(low)
    q.submit(entry("high", order, priority=100))
    q.charge("high", 0, 1000)  # high is far over on tokens, but tiers come first
    q.submit(entry("high", order, priority=100))
    assert low.state == "refused"


def test_newcomer_slot_starts_a_tenant_with_nothing_running():
    q, _ = make(limit=2, newcomer_slots=1)
    order = []
    for _ in range(4):
        q.submit(entry("w", order))
    assert q.running == 2 and q.queued == 2
    m = entry("m", order)
    q.submit(m)
    assert m.state == "running" and q.running == 3
    m2 = entry("m", order)  # m now has one running: it queues like anyone
    q.submit(m2)
    assert m2.state == "queued"


def test_newcomer_slots_never_pass_max_num_seqs():
    q, _ = make(limit=2, max_num_seqs=2, newcomer_slots=4)
    q.submit(entry("w"))
    q.submit(entry("w"))
    m = entry("m")
    q.submit(m)
    assert m.state == "queued"


def test_dispatch_limit_bounds_what_runs():
    for limit in (1, 3):
        q, _ = make(limit=limit)
        for _ in range(5):
            q.submit(entry("a"))
        assert q.running == limit and q.queued == 5 - limit


def test_adaptive_limit_rises_while_within_the_slo_and_falls_when_not():
    limit = AdaptiveLimit(AdaptiveLimitConfig(initial=4, window=4, min_limit=1, slow_start=False), max_limit=6,
                          tpot_s=0.1)
    for _ in range(4):
        limit.observe(0.05)
    assert limit() == 4  # no demand for more slots: no rise
    for _ in range(3):
        limit.saw_full()
        for _ in range(4):
            limit.observe(0.05)
    assert limit() == 6  # +1 per window, capped at max_num_seqs
    for _ in range(4):
        limit.observe(0.2)  # TPOT over its target
    assert limit() == 4  # floor(6 * 0.75)
    for _ in range(8):
        limit.observe(0.2)
    assert limit() == 2
    for _ in range(40):
        limit.observe(0.2)
    assert limit() == 1  # never below min_limit (1 here)
    for _ in range(40):
        limit.observe(None)  # a one-token request has no TPOT: not a report
    assert limit() == 1


def test_adaptive_limit_follows_tpot_not_ttft():
    """A closed loop's refills push vLLM's TTFT over the target whatever the batch; the limit
    judged on it backed off and turned the wait into queue wait (half the goodput): gone."""
    import pydantic

    limit = AdaptiveLimit(AdaptiveLimitConfig(initial=4, window=2), max_limit=32, tpot_s=0.1)
    for _ in range(3):
        limit.saw_full()
        limit.observe(0.05)
        limit.observe(0.05)
    assert limit() == 32  # within TPOT, demand for slots: 4 -> 8 -> 16 -> 32
    with pytest.raises(pydantic.ValidationError, match="ttft_s is no longer read"):
        AdaptiveLimitConfig(ttft_s=2.5)


def test_adaptive_limit_starts_where_vllm_alone_would_and_backs_off_on_tpot():
    limit = AdaptiveLimit(AdaptiveLimitConfig(window=2), max_limit=32, tpot_s=0.1)
    assert limit() == 32  # initial None: max_num_seqs
    limit.observe(0.2)
    limit.observe(0.2)
    assert limit() == 24


def test_adaptive_limit_doubles_until_it_is_first_lowered_then_adds_one():
    limit = AdaptiveLimit(AdaptiveLimitConfig(initial=4, window=2), max_limit=256, tpot_s=0.1)

    def window(tpot_s):
        limit.saw_full()
        for _ in range(2):
            limit.observe(tpot_s)
        return limit()
    assert [window(0.05) for _ in range(3)] == [8, 16, 32]  # slow start
    assert window(0.2) == 24  # over the target: lowered, slow start over
    assert [window(0.05) for _ in range(2)] == [25, 26]
    assert [window(0.05) for _ in range(10)][-1] == 36
    capped = AdaptiveLimit(AdaptiveLimitConfig(initial=4, window=1), max_limit=6, tpot_s=0.1)
    capped.saw_full()
    capped.observe(0.05)
    assert capped() == 6  # doubling stops at max_num_seqs


def test_adaptive_limit_decides_after_window_s_once_each_slot_reported():
    clock = Clock()
    limit = AdaptiveLimit(AdaptiveLimitConfig(initial=4, window=20, window_s=10.0), max_limit=32,
                          tpot_s=0.1, clock=clock)
    limit.saw_full()
    for _ in range(4):
        limit.observe(0.05)
    assert limit() == 4  # a report per slot, but not yet window_s into the window
    clock.now += 10.0
    limit.observe(0.05)
    assert limit() == 8  # 10 s and 5 reports >= the limit of 4: judged (slow start doubles)
    clock.now += 10.0
    limit.saw_full()
    for _ in range(7):
        limit.observe(0.05)
    assert limit() == 8  # 10 s, but fewer reports than the 8 slots
    limit.observe(0.05)
    assert limit() == 16
    untimed = AdaptiveLimit(AdaptiveLimitConfig(initial=4, window=20, window_s=None), max_limit=32,
                            tpot_s=0.1, clock=clock)
    untimed.saw_full()
    clock.now += 100.0
    for _ in range(19):
        untimed.observe(0.05)
    assert untimed() == 4  # window_s None: 20 reports or nothing


def test_adaptive_limit_targets_override_the_slo():
    limit = AdaptiveLimit(AdaptiveLimitConfig(initial=4, window=1, tpot_s=0.5), max_limit=8, tpot_s=0.1)
    limit.observe(0.3)  # over the slo's 0.1, within the config's 0.5
    assert limit() == 4
    limit.observe(0.6)
    assert limit() == 3


def test_queue_dispatches_more_when_the_limit_rises():
    limit = AdaptiveLimit(AdaptiveLimitConfig(initial=1, window=1, min_limit=1), max_limit=4, tpot_s=1.0)
    q, _ = make(limit=limit)
    for _ in range(3):
        q.submit(entry("a"))
    assert q.running == 1
    assert limit.observe(0.1)  # saw_full was called when the others queued
    q.pump()
    assert q.running == 2


def test_snapshot_lists_tenants():
    q, _ = make(limit=1)
    q.submit(entry("a"))
    q.submit(entry("b"))
    q.charge("a", 1, 1)
    snap = q.snapshot()
    assert snap["dispatch_limit"] == 1 and snap["dispatched"] == 1 and snap["queued"] == 1
    assert snap["tenants"]["a"] == {"queued": 0, "running": 1, "prefilling": 1, "counter": 3.0, "dispatches": 1,
                                    "queue_wait_s": 0.0}
    assert snap["tenants"]["b"]["queued"] == 1


# -- issue 20's benchmark misses, on the fake clock ------------------------------------------------
def test_an_old_backlog_does_not_jump_a_fresh_tenant_of_the_same_tier():
    # The noisy neighbour: w's queue is older than aging_s, m's request is fresh. Aging used to
    # rank w's head as the top tier, so w went first whatever the counters said.
    q, clock = make(limit=1, aging_s=10.0, max_queued=100)
    order = []
    q.submit(entry("w", order))
    for _ in range(5):
        q.submit(entry("w", order))
    q.charge("w", 0, 100)
    clock.now += 30.0  # w's backlog is old
    m = entry("m", order)
    q.submit(m)  # lifted to w's counter
    q.charge("w", 0, 10)  # w's running request goes on generating
    q.finish(order[0])
    assert order[-1] is m


def test_a_full_queue_refuses_the_heavy_tenant_not_a_fresh_one_behind_its_old_backlog():
    # m has one request queued (its previous one still runs), w holds the rest of the queue and
    # its requests are older than aging_s: the refused request is w's, however old its backlog.
    q, clock = make(limit=2, aging_s=10.0, max_queued=4)
    order = []
    q.submit(entry("w", order))
    q.submit(entry("m", order))  # m runs
    w_queued = [entry("w", order) for _ in range(3)]
    for e in w_queued:
        q.submit(e)
    clock.now += 30.0
    m2 = entry("m", order)
    q.submit(m2)  # m: one running, so it queues
    assert m2.state == "queued" and q.queued == 4
    q.submit(entry("w", order))  # queue full: w is the one over its share
    assert m2.state == "queued"
    assert q.refused["fair_share"] == 1
    assert all(e.state != "refused" for e in w_queued[:2])


def test_a_just_lifted_tenant_with_a_long_prompt_is_not_refused_for_the_heavy_ones_backlog():
    # m was lifted to w's counter and charged a long prompt: its counter is above w's, yet w holds
    # the queue; a counter rule would refuse m's one queued request.
    q, _ = make(limit=1, max_queued=3)
    order = []
    q.submit(entry("w", order))
    q.submit(entry("w", order))
    q.submit(entry("w", order))
    m = entry("m", order)
    q.submit(m)  # queued, lifted to w's counter
    q.charge("m", 2000, 0)  # as if its previous request's long prompt was just prefilled
    assert q.tenants["m"].counter > q.tenants["w"].counter
    q.submit(entry("w", order))
    assert m.state == "queued"


def test_held_requests_count_per_unit_of_weight_when_shedding():
    # With heavy's next request, heavy (weight 2) holds 3 (1.5 per unit of weight), light
    # (weight 1) holds 2: light is further over its share, though heavy holds more.
    q, _ = make(limit=1, max_queued=3)
    order = []
    q.submit(entry("heavy", order, weight=2.0))
    heavy = entry("heavy", order, weight=2.0)
    light = [entry("light", order) for _ in range(2)]
    for e in [heavy] + light:
        q.submit(e)
    nxt = entry("heavy", order, weight=2.0)
    q.submit(nxt)
    assert light[-1].state == "refused" and heavy.state == nxt.state == "queued"


def test_aging_lets_a_lower_tier_through_once_per_aging_s_not_all_at_once():
    q, clock = make(limit=1, aging_s=5.0, max_queued=100)
    order = []
    q.submit(entry("low", order))  # runs
    for _ in range(4):
        q.submit(entry("low", order))
    for _ in range(4):
        q.submit(entry("high", order, priority=100))
    clock.now += 6.0  # low's backlog is old
    served = []
    for _ in range(4):
        q.finish([e for e in order if e.state == "running"][0])
        served.append(order[-1].tenant)
    assert served == ["low", "high", "high", "high"]  # one aged pass, then the tier again
    clock.now += 5.0
    q.finish([e for e in order if e.state == "running"][0])
    assert order[-1].tenant == "low"


def test_shedding_uses_the_priority_not_the_aged_tier():
    # Old low-priority requests (aged) may not push out a high-priority tenant's request.
    q, clock = make(limit=1, aging_s=5.0, max_queued=3)
    order = []
    q.submit(entry("low", order))
    low = [entry("low", order) for _ in range(2)]
    for e in low:
        q.submit(e)
    clock.now += 10.0
    high = entry("high", order, priority=100)
    q.submit(high)
    q.charge("high", 0, 5000)  # high far over on tokens: the tier still comes first
    q.submit(entry("high", order, priority=100))
    assert high.state == "queued" and low[-1].state == "refused"


def test_adaptive_limit_never_falls_below_its_floor():
    limit = AdaptiveLimit(AdaptiveLimitConfig(initial=4, window=1, min_limit=3), max_limit=8, tpot_s=0.1)
    for _ in range(10):
        limit.observe(1.0)
    assert limit() == 3
    capped = AdaptiveLimit(AdaptiveLimitConfig(initial=1, min_limit=6), max_limit=4, tpot_s=0.1)
    assert capped() == 4  # the floor is at most max_num_seqs; the start at least the floor


# -- long runs on a fake engine (tests/unit/engine/fair_queue_fake_engine.py), shipped CPU config --
import pytest  # noqa: E402

from fair_queue_fake_engine import STEP_S, Sender, run, shipped_queue  # noqa: E402


@pytest.mark.parametrize("weights, ratio", [((2.0, 1.0), 2.0), ((1.0, 1.0), 1.0)])
@pytest.mark.parametrize("tokens", [32, 96])
def test_two_backlogged_tenants_are_served_tokens_by_their_weights(weights, ratio, tokens):
    # The benchmark's weights shape: 24 in flight each, more than the limit + max_queued hold,
    # so both queue and are refused by share. Served tokens and slot-time follow the weights;
    # the equal-weight case shows the measure would catch weights being ignored (1:1 then).
    r = run([Sender("heavy", tokens, weight=weights[0], workers=24),
             Sender("light", tokens, weight=weights[1], workers=24)], steps=4000)
    assert r.served["heavy"] / r.served["light"] == pytest.approx(ratio, rel=0.10)
    assert r.tokens["heavy"] / r.tokens["light"] == pytest.approx(ratio, rel=0.10)  # slot-steps
    limit = shipped_queue()[0]["dispatch_limit"]
    # The slots stay full (prefill pacing only staggers the first refills: a slot waits at most
    # one step for the next tenant by VTC), and the reserve is not a second limit.
    assert 0.98 * limit <= sum(r.running) / len(r.running) <= limit + 0.5


def test_a_light_tenant_never_waits_in_the_queue_behind_a_backlogged_one():
    # The noisy-neighbour shape: W keeps 48 requests of 96 tokens outstanding; M sends one of 16
    # every 2 s, so under load M has two or three in flight. Each M request starts at once (in a
    # reserved slot while M runs fewer than its share of the limit); W still gets the rest.
    r = run([Sender("w", 96, workers=48), Sender("m", 16, every=int(2 / STEP_S))], steps=2400)
    assert len(r.waits["m"]) >= 295 and max(r.waits["m"]) == 0.0
    assert r.refused["m"] == 0
    # W keeps every slot of the limit (M's requests ride in reserved slots beside it): W's 96
    # tokens per request are its slot-steps, so its tokens per step are the slots it holds.
    assert r.tokens["w"] / len(r.running) >= 0.99 * shipped_queue()[0]["dispatch_limit"]


def test_a_backlogged_tenant_refills_its_slot_while_a_light_one_runs_in_the_reserve():
    q, _ = make(limit=4, max_num_seqs=8, newcomer_slots=2)
    order = []
    for _ in range(6):
        q.submit(entry("w", order))
    m = entry("m")
    q.submit(m)
    assert m.state == "running" and m.reserved and q.running == 5
    q.finish(order[0])
    assert q.tenants["w"].running == 4 and q.running == 5  # not 3: m's request is beside the limit
    q.submit(entry("m"))
    q.submit(third := entry("m"))  # the reserve is spent: m queues, and its reserved ones count again
    assert third.state == "queued" and q.running == 6
    q.finish(order[1])
    q.finish(order[2])  # both backlogged: m's two count against the limit of 4, w is not refilled
    assert third.state == "queued" and q.tenants["w"].running == 2 and q.running == 4


def test_only_a_tenant_under_its_share_takes_a_reserved_slot():
    q, _ = make(limit=4, max_num_seqs=8, newcomer_slots=2)
    order = []
    for _ in range(5):
        q.submit(entry("w", order))
    assert q.running == 4 and len(q.tenants["w"].queue) == 1  # the limit
    q.submit(entry("m", order))
    q.submit(entry("m", order))  # share: 4 x 1 / 2 = 2, so a second one still starts at once
    assert q.running == 6 and q.tenants["m"].running == 2
    q.submit(entry("m", order))  # at its share (and the reserve is spent): it queues
    assert q.tenants["m"].running == 2 and len(q.tenants["m"].queue) == 1
    q.charge("w", 0, 10)
    q.finish(order[0])  # 5 running, over the limit: a reserved slot, and neither is under its share
    assert q.running == 5 and q.tenants["m"].running == 2
    q.finish(order[1])
    q.finish(order[2])  # under the limit again: VTC's pick, m (served less) ...
    assert q.tenants["m"].running == 3
    assert q.tenants["w"].running == 2 and q.running == 5  # ... then w, down to 1 < its share, a reserved one


def test_snapshot_shows_what_each_tenant_waited_in_the_queue():
    q, clock = make(limit=1)
    order = []
    q.submit(entry("a", order))
    q.submit(entry("b", order))
    clock.now += 3.0
    q.finish(order[0])
    b = q.snapshot()["tenants"]["b"]
    assert (b["dispatches"], b["queue_wait_s"]) == (1, 3.0)


# -- prefill pacing (max_prefilling_per_tenant) ----------------------------------------------------
def test_pacing_dispatches_a_tenants_next_request_at_its_previous_ones_first_token():
    q, _ = make(limit=8, max_prefilling_per_tenant=1)
    order = []
    q.submit(entry("other"))  # pacing protects another active tenant
    first, second = entry("w", order), entry("w", order)
    q.submit(first)
    q.submit(second)
    assert [e.state for e in (first, second)] == ["running", "queued"]  # a free slot, but w is in prefill
    q.first_token(first)
    assert second.state == "running"
    q.first_token(first)  # told twice: no second release
    assert q.snapshot()["tenants"]["w"]["prefilling"] == 1


def test_pacing_holds_only_the_tenant_in_prefill():
    q, _ = make(limit=8, max_prefilling_per_tenant=1)
    m0, w0, w1, m1 = entry("m"), entry("w"), entry("w"), entry("m")
    for e in (m0, w0, w1, m1):
        q.submit(e)
    # w's second waits for its first's prefill; m's own pacing holds m1, never w's
    assert [e.state for e in (m0, w0, w1, m1)] == ["running", "running", "queued", "queued"]
    q.charge("w", 0, 10)  # m is next by VTC (were w next, the free slot would wait for w's prefill)
    q.first_token(m0)
    assert [w1.state, m1.state] == ["queued", "running"]


def test_a_request_ending_in_prefill_releases_its_tenant():
    q, _ = make(limit=8, max_prefilling_per_tenant=1)
    q.submit(entry("other"))
    w0, w1 = entry("w"), entry("w")
    q.submit(w0)
    q.submit(w1)
    q.finish(w0)  # failed or cancelled before its first token
    assert w1.state == "running"


def test_requests_held_by_pacing_do_not_tell_the_adaptive_limit_it_was_full():
    full = []
    limit = FixedLimit(8)
    limit.saw_full = lambda: full.append(1)
    q, _ = make(limit=limit, max_prefilling_per_tenant=1)
    q.submit(entry("other"))
    q.submit(entry("w"))
    q.submit(entry("w"))
    assert full == []


def test_without_pacing_a_tenants_requests_start_together():
    q, _ = make(limit=8)
    es = [entry("w") for _ in range(3)]
    for e in es:
        q.submit(e)
    assert [e.state for e in es] == ["running"] * 3


def test_a_paced_tenant_next_by_vtc_keeps_the_free_slot_rather_than_lose_its_weight():
    # Two slots free together; heavy (weight 2) is next by VTC for both. Pacing holds its second
    # refill until its first token; the slot waits for it instead of going to light.
    q, _ = make(limit=2, max_prefilling_per_tenant=1)
    order = []
    running = [entry("heavy", order, weight=2.0), entry("light", order)]
    for e in running:
        q.submit(e)
    heavy = [entry("heavy", order, weight=2.0) for _ in range(2)]
    light = entry("light", order)
    for e in heavy + [light]:
        q.submit(e)
    q.charge("light", 0, 10)  # light was served more: heavy is next by VTC
    q.first_token(running[0])
    q.first_token(running[1])
    q.finish(running[0])
    q.finish(running[1])
    assert [heavy[0].state, heavy[1].state, light.state] == ["running", "queued", "queued"]
    q.first_token(heavy[0])
    assert heavy[1].state == "running" and light.state == "queued"


def test_a_tenant_alone_is_not_paced_and_is_once_another_arrives():
    q, _ = make(limit=8, max_prefilling_per_tenant=1)
    alone = [entry("w") for _ in range(3)]
    for e in alone:
        q.submit(e)
    assert [e.state for e in alone] == ["running"] * 3  # nobody to protect: all start at once
    q.submit(entry("m"))
    later = entry("w")
    q.submit(later)
    assert later.state == "queued"  # m is active now: w waits for its prefills to end
    q.first_token(alone[0])
    q.first_token(alone[1])
    assert later.state == "queued"
    q.first_token(alone[2])
    assert later.state == "running"


def test_snapshot_shows_an_idle_tenant_whose_counter_is_kept():
    # Its counter still weighs its next request; a metrics publish between two of its requests
    # must see it (a gauge never set is not exported at all).
    q, _ = make(limit=1)
    order = []
    q.submit(entry("a", order))
    q.charge("a", 2, 2)
    q.finish(order[0])
    assert "a" not in q.active and q.tenants["a"].counter > 0
    assert q.snapshot()["tenants"]["a"] == {"queued": 0, "running": 0, "prefilling": 0,
                                            "counter": q.tenants["a"].counter,
                                            "dispatches": 0, "queue_wait_s": 0.0}
