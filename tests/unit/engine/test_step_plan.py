"""The tenant scheduler's choices as plain logic (engine/step_plan.py, engine/step_cost.py)."""

import pytest

from loraplex.engine.step_cost import Coefficients, StepCost
from loraplex.engine.step_plan import MAX_HELD_STEPS, DecodeWork, PromptWork, keep_decodes, plan_step
from loraplex.engine.tenant_counters import TenantCounters


def work(key, tenant, remaining, running=False, arrival=0.0, tier=0):
    return PromptWork(key=key, tenant=tenant, tier=tier, remaining=remaining, running=running, arrival=arrival)


def test_one_tenant_alone_gets_vllms_own_step_uncapped():
    plan = plan_step(["a", "a"], [work("a1", "a", 1000, running=True), work("a2", "a", 900)], TenantCounters(),
                     budget_when_shared=64, ceiling=2048, floor=32)
    assert not plan.shared and plan.prompt_budget == 2048 and plan.chunk_cap == 0 and not plan.held


def test_a_shared_step_takes_the_tpot_sized_budget_within_floor_and_ceiling():
    counters = TenantCounters()
    shared = plan_step(["chat"], [work("l1", "long", 1000, running=True)], counters, 100, 2048, 32)
    assert shared.shared and shared.prompt_budget == 100 and shared.chunk_cap == 100
    assert plan_step(["chat"], [work("l1", "long", 1000)], counters, 0, 2048, 32).prompt_budget == 32  # floor
    assert plan_step(["chat"], [work("l1", "long", 1000)], counters, 5000, 2048, 32).prompt_budget == 2048


def test_two_tenants_prompting_with_nothing_decoding_share_a_sized_step():
    # A newcomer's short prompt beside another's long one: a step of 2,048 prompt tokens would be
    # its TTFT (5.8 s on this CPU).
    plan = plan_step([], [work("a1", "a", 3000), work("b1", "b", 30)], TenantCounters(), 100, 2048, 32)
    assert plan.shared and plan.prompt_budget == 100
    assert plan.shares == {"a": 70, "b": 30} and plan.chunk_cap == 70


def test_the_budget_is_split_max_min_fair_and_a_short_prompt_gets_all_it_needs():
    plan = plan_step(["long"], [work("l1", "long", 1000, running=True, arrival=1.0), work("c1", "chat", 16, arrival=2.0)],
                     TenantCounters(), 100, 2048, 8)
    assert plan.shares == {"long": 84, "chat": 16}
    assert plan.chunk_cap == 84  # the long prompt is cut into a chunk; the short one is whole
    assert set(plan.order) == {"l1", "c1"} and not plan.held


def test_past_budget_over_floor_tenants_the_highest_counters_wait_a_step():
    counters = TenantCounters()
    for t, c in {"a": 3.0, "b": 1.0, "c": 2.0}.items():
        counters.charge(t, c)
    plan = plan_step(["x"], [work("a1", "a", 500), work("b1", "b", 500), work("c1", "c", 500)], counters, 64, 2048, 32)
    assert set(plan.shares) == {"b", "c"} and plan.held == {"a1"}  # 64 // 32: two tenants, lowest counters


def test_a_tenants_further_prompts_wait_while_its_first_is_a_chunk():
    plan = plan_step(["chat"], [work("l1", "long", 1000, running=True, arrival=1.0), work("l2", "long", 1000, arrival=2.0)],
                     TenantCounters(), 100, 2048, 32)
    assert plan.order == ["l1"] and plan.held == {"l2"}


def test_whole_short_prompts_of_a_tenant_fill_its_share_and_a_longer_one_waits():
    plan = plan_step(["x"], [work("s1", "s", 10, arrival=1.0), work("s2", "s", 10, arrival=2.0),
                             work("s3", "s", 500, arrival=3.0)], TenantCounters(), 100, 2048, 32)
    assert plan.order == ["s1", "s2"] and plan.held == {"s3"}  # s3 would overrun the share as a chunk


def test_a_higher_tier_is_served_first_whatever_its_counter():
    counters = TenantCounters()
    counters.charge("vip", 100.0)
    plan = plan_step(["x"], [work("v", "vip", 500, tier=0), work("p", "plain", 500, tier=100)], counters, 32, 2048, 32)
    assert plan.order == ["v"] and plan.held == {"p"}


def test_a_newcomer_is_lifted_to_the_lowest_active_counter_and_served_in_the_next_step():
    counters = TenantCounters()
    counters.charge("long", 50.0)
    counters.charge("old", 80.0)  # was busy long ago, then idle: its counter stays (no credit)
    counters.arrive("chat", active={"long"})
    assert counters.get("chat") == 50.0
    # long was charged for the step it just ran: the newcomer goes first in the next one.
    counters.charge("long", 0.2)
    plan = plan_step(["long"], [work("l1", "long", 1000, running=True), work("c1", "chat", 16, arrival=9.0)],
                     counters, 32, 2048, 32)
    assert plan.order[0] == "c1" and plan.shares["chat"] == 16
    counters.arrive("old", active={"long", "chat"})
    assert counters.get("old") == 80.0  # a lift never lowers a counter


def test_weights_divide_the_charge_and_idle_tenants_are_forgotten():
    counters = TenantCounters()
    counters.charge("heavy", 2.0, weight=2.0)
    counters.charge("light", 2.0)
    assert counters.get("heavy") == 1.0 and counters.get("light") == 2.0
    counters.forget_idle(active={"light"})
    assert "heavy" not in counters.counter and "light" in counters.counter


def test_step_cost_fits_the_engines_own_step_times_and_sizes_the_budget():
    true = Coefficients(base_s=0.02, per_decode_s=0.001, per_prompt_s=0.0005)
    cost = StepCost(prior=Coefficients(0.2, 0.01, 0.01), horizon_steps=200, min_steps=10)
    assert cost.coefficients.per_prompt_s == 0.01  # the prior, before min_steps
    for i in range(400):
        d, p = 1 + i % 16, (i * 37) % 300
        cost.observe(d, p, true.base_s + true.per_decode_s * d + true.per_prompt_s * p)
    fit = cost.coefficients
    assert fit.base_s == pytest.approx(0.02, rel=0.05) and fit.per_prompt_s == pytest.approx(0.0005, rel=0.05)
    # A step of 10 decodes (0.03 s) within a 0.1 s target leaves 0.07 s: 140 prompt tokens.
    assert cost.prompt_budget(10, 0.1) == pytest.approx(140, abs=2)
    assert cost.prompt_budget(200, 0.1) == 0  # the decodes alone take longer than the target
    # One decode's share of a 40-token step: 1/40 of the fixed part plus its own cost; a 39-token
    # chunk beside it pays the rest.
    assert cost.seconds(1, 0, 40) == pytest.approx(0.02 / 40 + 0.001, rel=0.05)
    assert cost.seconds(0, 39, 40) == pytest.approx(0.02 * 39 / 40 + 39 * 0.0005, rel=0.05)


def test_step_cost_follows_a_machine_that_slows_down():
    cost = StepCost(prior=Coefficients(0.02, 0.001, 0.0005), horizon_steps=100, min_steps=1)
    for i in range(1000):
        d, p = 1 + i % 8, (i * 13) % 200
        slow = 2.0 if i >= 500 else 1.0
        cost.observe(d, p, slow * (0.02 + 0.001 * d + 0.0005 * p))
    assert cost.coefficients.per_prompt_s == pytest.approx(0.001, rel=0.1)


def test_long_runs_of_decode_only_steps_do_not_wind_the_fit_up():
    cost = StepCost(prior=Coefficients(0.02, 0.001, 0.0005), horizon_steps=50, min_steps=1)
    for i in range(200):
        cost.observe(8, (i * 13) % 200, 0.02 + 0.008 + 0.0005 * ((i * 13) % 200))
    for _ in range(5000):  # decodes only: nothing said of prompt tokens
        cost.observe(8, 0, 0.028)
    cost.observe(8, 100, 0.028 + 0.05 * 3)  # one outlier step must not throw the prompt cost far off
    assert 0.0002 < cost.coefficients.per_prompt_s < 0.01


def test_sized_steps_that_run_longer_than_the_fit_predicts_shrink_the_budget():
    true = Coefficients(base_s=0.02, per_decode_s=0.001, per_prompt_s=0.0005)
    cost = StepCost(prior=true, horizon_steps=200, min_steps=1)
    for i in range(50):
        d, p = 1 + i % 16, (i * 37) % 300
        cost.observe(d, p, true.base_s + true.per_decode_s * d + true.per_prompt_s * p)
    before = cost.prompt_budget(10, 0.1)
    for _ in range(300):  # steps sized by the budget run 20 ms over what the linear model says
        cost.observe(10, before, 0.1 + 0.02, sized=True)
    # The fit and the sized steps' own error between them take it back: within a few tokens of
    # the budget that ends such a step on time.
    assert cost.prompt_budget(10, 0.1) <= before - 30


def test_a_tenant_gone_moments_ago_keeps_the_step_sized():
    alone = plan_step(["long"], [work("l1", "long", 1000, running=True)], TenantCounters(), 100, 2048, 32)
    assert not alone.shared and alone.prompt_budget == 2048
    lingering = plan_step(["long"], [work("l1", "long", 1000, running=True)], TenantCounters(), 100, 2048, 32,
                          recent=["chat"])
    assert lingering.shared and lingering.prompt_budget == 100 and lingering.chunk_cap == 100
    # ...also when nothing decodes: the recent tenant's next prompt must not wait out a whole step.
    prompts_only = plan_step([], [work("l1", "long", 1000, running=True)], TenantCounters(), 100, 2048, 32,
                             recent=["chat"])
    assert prompts_only.shared and prompts_only.prompt_budget == 100


def test_a_shared_steps_decodes_past_its_cap_go_by_tier_then_counter_max_min_by_weight_oldest_first():
    counters = TenantCounters()
    counters.charge("heavy", 5.0)
    decodes = ([DecodeWork(f"h{i}", "heavy", 0, arrival=10 - i) for i in range(10)]
               + [DecodeWork(f"c{i}", "chat", 0, arrival=0) for i in range(2)])
    kept = keep_decodes(decodes, counters, 6)
    assert {"c0", "c1"} <= kept and len(kept) == 6  # the light tenant's few all run
    assert kept - {"c0", "c1"} == {"h9", "h8", "h7", "h6"}  # the heavy one's oldest
    # Two heavy tenants share the cap equally, whatever their counters...
    counters.charge("other", 50.0)
    both = [DecodeWork(f"h{i}", "heavy", 0, 0) for i in range(10)] + [DecodeWork(f"o{i}", "other", 0, 0) for i in range(10)]
    kept = keep_decodes(both, counters, 8)
    assert sum(k.startswith("h") for k in kept) == 4 and sum(k.startswith("o") for k in kept) == 4
    # ...or by their weights.
    both = ([DecodeWork(f"h{i}", "heavy", 0, 0, weight=2.0) for i in range(20)]
            + [DecodeWork(f"o{i}", "other", 0, 0) for i in range(20)])
    kept = keep_decodes(both, counters, 30)
    assert sum(k.startswith("h") for k in kept) == 20 and sum(k.startswith("o") for k in kept) == 10
    # A higher tier (lower priority value) first, whatever its counter; within the cap, all kept.
    tiers = [DecodeWork("o0", "other", 0, 0), DecodeWork("h0", "heavy", 1, 0), DecodeWork("h1", "heavy", 1, 1)]
    assert keep_decodes(tiers, counters, 2) == {"o0", "h0"}
    assert keep_decodes(tiers, counters, 3) == {"o0", "h0", "h1"}


def test_a_shared_steps_decodes_past_its_cap_go_tightest_class_first():
    """The step is sized to the tightest TPOT target: that class's decodes are the ones it carries,
    before a looser class's, whatever the counters (a hold that kept the looser would pace no one)."""
    counters = TenantCounters()
    counters.charge("agent", 5.0)
    decodes = ([DecodeWork(f"a{i}", "agent", 0, 0, tpot_s=0.16) for i in range(8)]
               + [DecodeWork(f"c{i}", "chat", 0, 0, tpot_s=0.24) for i in range(8)])
    kept = keep_decodes(decodes, counters, 10)
    assert {f"a{i}" for i in range(8)} <= kept and len(kept) == 10
    # Without classes (both inf), the counter and the water level decide: 5 each.
    flat = [DecodeWork(d.key, d.tenant, 0, 0) for d in decodes]
    assert sum(k.startswith("a") for k in keep_decodes(flat, counters, 10)) == 5



def test_a_decode_held_max_held_steps_in_a_row_goes_first_within_its_tenants_share():
    counters = TenantCounters()
    counters.charge("heavy", 5.0)

    def decodes(held_steps):
        return ([DecodeWork(f"h{i}", "heavy", 0, arrival=i, held_steps=held_steps.get(i, 0)) for i in range(10)]
                + [DecodeWork(f"c{i}", "chat", 0, arrival=0) for i in range(2)])

    assert keep_decodes(decodes({}), counters, 6) == {"c0", "c1", "h0", "h1", "h2", "h3"}
    # Held one step short of the bound: still the oldest first.
    assert keep_decodes(decodes({9: MAX_HELD_STEPS - 1}), counters, 6) == {"c0", "c1", "h0", "h1", "h2", "h3"}
    # At the bound it goes first, in place of its tenant's newest kept one; the other tenant's
    # share is the same (the bound moves a tenant's turn among its own decodes, never across tenants).
    kept = keep_decodes(decodes({9: MAX_HELD_STEPS, 5: MAX_HELD_STEPS + 3}), counters, 6)
    assert kept == {"c0", "c1", "h5", "h9", "h0", "h1"}  # the longest held first, then the oldest
    # A tenant with no share this step (last by counter, one decode for each tenant before it) gets none from it.
    counters.charge("other", 1.0)
    assert keep_decodes(decodes({9: 100}) + [DecodeWork("o0", "other", 0, arrival=0)], counters, 2) == {"c0", "o0"}

def test_a_shared_steps_prompt_budget_is_split_by_weight():
    plan = plan_step(["x"], [PromptWork("h1", "heavy", 0, 3000, False, 0.0, weight=2.0),
                             PromptWork("l1", "light", 0, 3000, False, 0.0)], TenantCounters(), 90, 2048, 8)
    assert plan.shares == {"heavy": 60, "light": 30}


def test_decode_capacity_leaves_room_for_the_least_prompt_work():
    cost = StepCost(prior=Coefficients(base_s=0.04, per_decode_s=0.004, per_prompt_s=0.001), min_steps=10**9)
    assert cost.decode_capacity(0.24) == 50
    assert cost.decode_capacity(0.24, prompt_tokens=32) == 42
    assert cost.decode_capacity(0.01) == 1  # a step always makes progress
