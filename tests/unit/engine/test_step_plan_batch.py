"""Batch lines in the tenant scheduler: ranked after every online tier, served only from the prompt
budget online work leaves, and (in the vLLM glue) a tenant of their own."""

from types import SimpleNamespace

from loraplex.engine.step_plan import PromptWork, plan_step
from loraplex.engine.tenant_counters import TenantCounters
from loraplex.engine.tenant_scheduler import BATCH_ARG, BATCH_TIER, TENANT_ARG, request_tenant, tier


def work(key, tenant, remaining, batch=False, arrival=0.0):
    return PromptWork(key=key, tenant=tenant, tier=BATCH_TIER if batch else 0, remaining=remaining, running=False,
                      arrival=arrival, batch=batch)


def test_a_batch_line_gets_only_what_online_prompts_leave():
    counters = TenantCounters()
    counters.charge("web", 100.0)  # online served far more than the batch: VTC alone would favour the batch
    plan = plan_step(["web"], [work("b1", "acme#batch", 3000, batch=True), work("w1", "web", 3000)],
                     counters, 100, 2048, 16)
    assert plan.shares == {"web": 100, "acme#batch": 0}
    assert "b1" in plan.held and plan.order == ["w1"]
    short = plan_step(["web"], [work("b1", "acme#batch", 3000, batch=True), work("w1", "web", 30)],
                      counters, 100, 2048, 16)
    assert short.shares == {"web": 30, "acme#batch": 70}  # the rest of the step is the batch's


def test_the_budget_too_small_for_both_serves_the_online_tenant():
    plan = plan_step(["web"], [work("b1", "acme#batch", 50, batch=True, arrival=0.0), work("w1", "web", 50, arrival=9.0)],
                     TenantCounters(), 16, 2048, 16)
    assert plan.order == ["w1"] and plan.held == {"b1"}


def request(tenant, batch=False, priority=0):
    args = {TENANT_ARG: tenant, **({BATCH_ARG: True} if batch else {})}
    return SimpleNamespace(sampling_params=SimpleNamespace(extra_args=args), priority=priority)


def test_a_batch_line_is_a_tenant_of_its_own_below_every_online_tier():
    assert request_tenant(request("acme", batch=True))[0] == "acme#batch"
    assert request_tenant(request("acme"))[0] == "acme"
    assert tier(request("acme", batch=True, priority=0)) > tier(request("acme", priority=100))
