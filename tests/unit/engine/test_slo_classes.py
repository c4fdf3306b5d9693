"""SLO classes in the engine: each rule of docs/operations.md's SLO classes, each test failing
without it. The tenant scheduler over vLLM's real Scheduler with fake steps (as
test_tenant_scheduler.py), the step plan as plain logic, the fair queue on a fake clock."""

from __future__ import annotations

import random
import time

from vllm.v1.engine.core import EngineCore

from bench.fake_steps import fake_request as request
from bench.fake_steps import fake_step as step
from bench.fake_steps import make_scheduler
from loraplex.contract import EngineCall, SloTargets
from loraplex.engine.config import FairQueueConfig, TenantSchedulerConfig
from loraplex.engine.dispatch_limit import FixedLimit
from loraplex.engine.fair_queue import Entry, FairQueue
from loraplex.engine.step_cost import Coefficients
from loraplex.engine.step_plan import PromptWork, plan_step
from loraplex.engine.tenant_counters import TenantCounters
from loraplex.engine.tenant_scheduler import CONFIG_KEY, UNREACHABLE_UTILITY, TenantScheduler
from loraplex.engine.vllm_engine import engine_args

from model_dir import default_model_dir

# As test_tenant_scheduler.py: 40 ms a step, 4 ms a decode, 1 ms a prompt token.
COSTS = Coefficients(base_s=0.04, per_decode_s=0.004, per_prompt_s=0.001)
CHAT = SloTargets("chat", ttft_s=2.5, tpot_s=0.3)
AGENT = SloTargets("agent", ttft_s=5.0, tpot_s=0.15)
INTERACTIVE = SloTargets("interactive", ttft_s=1.0, tpot_s=0.3)


def scheduler(max_num_seqs: int = 16, **settings):
    """The tenant scheduler keeping classes (off by default in the config) unless settings say otherwise."""
    config = TenantSchedulerConfig(**{"tpot_s": 0.3, "slo_classes": True, **settings})
    s = make_scheduler(TenantScheduler, str(default_model_dir()), {CONFIG_KEY: config.settings()},
                       token_budget=2048, max_num_seqs=max_num_seqs)
    s.cost.prior = COSTS
    s.cost.min_steps = 10**9
    return s


def of(tenant: str, tokens: dict[str, int]) -> int:
    return sum(n for rid, n in tokens.items() if rid.startswith(tenant + "-"))


def decoding(s, *requests) -> None:
    for _ in range(50):
        if all(r.num_computed_tokens >= r.num_prompt_tokens for r in requests):
            return
        step(s)
    raise AssertionError("requests never finished their prefill")


# -- step sizing by the tightest class --------------------------------------------------------------
def test_a_shared_step_is_sized_to_the_tightest_tpot_among_the_classes_decoding_in_it():
    def prompt_tokens(classes: bool, agent_decoding: bool) -> int:
        s = scheduler(slo_classes=classes)
        chat = [request("chat", 16, max_tokens=64, slo=CHAT) for _ in range(2)]
        agent = [request("agent", 16, max_tokens=64, slo=AGENT) for _ in range(2 if agent_decoding else 0)]
        for r in chat + agent:
            s.add_request(r)
        decoding(s, *chat, *agent)
        s.add_request(request("long", 3000, slo=CHAT))
        return of("long", step(s))

    # The agent's 0.15 s x 0.8 = 0.12 s: 0.12 - 0.04 - 4 x 4 ms = 64 prompt tokens.
    assert prompt_tokens(True, True) == 64
    # Its decodes gone, the chat class's 0.3 s x 0.8: 0.24 - 0.04 - 2 x 4 ms = 192.
    assert prompt_tokens(True, False) == 192
    # Classes off (today's single-SLO scheduler): the one 0.3 s target, whoever decodes.
    assert prompt_tokens(False, True) == 184


def test_a_class_the_step_cost_cannot_meet_is_counted_not_hidden():
    def unreachable(classes: bool, **settings) -> dict[str, int]:
        s = scheduler(slo_classes=classes, **settings)
        tight = SloTargets("tight", ttft_s=1.0, tpot_s=0.05)  # 0.04 s x 0.8 target: one decode takes 0.044 s
        a = request("a", 16, max_tokens=64, slo=tight)
        s.add_request(a)
        decoding(s, a)
        s.add_request(request("b", 16, max_tokens=64, slo=CHAT))
        for _ in range(5):
            step(s)
        return s.unreachable

    counted = unreachable(True)
    assert counted.get("tight", 0) >= 4 and "chat" not in counted
    # The replica reads it through EngineCore's utility call, which looks the method up on EngineCore.
    core = EngineCore.__new__(EngineCore)  # its methods, not its start
    core.scheduler = scheduler(slo_classes=True)
    core.scheduler.unreachable = dict(counted)
    assert getattr(core, UNREACHABLE_UTILITY)() == counted
    # Classes off: steps are sized to tpot_s, no class's; not counted, even where tpot_s cannot be met.
    assert unreachable(False) == {} and unreachable(False, tpot_s=0.05) == {}


def test_a_step_is_sized_to_the_tightest_class_it_can_reach_and_counts_the_tighter():
    s = scheduler()
    # A slower engine: a step costs 0.1 s. The agent's 0.12 s target cannot carry one decode and the
    # least prompt work (0.1 + 4 ms + 32 x 1 ms = 0.136 s); the chat class's 0.24 s can.
    s.cost.prior = Coefficients(base_s=0.1, per_decode_s=0.004, per_prompt_s=0.001)
    chat = [request("chat", 16, max_tokens=64, slo=CHAT) for _ in range(2)]
    agent = [request("agent", 16, max_tokens=64, slo=AGENT) for _ in range(2)]
    for r in chat + agent:
        s.add_request(r)
    decoding(s, *chat, *agent)
    s.unreachable.clear()
    s.add_request(request("long", 3000, slo=CHAT))
    # Sized to chat's target: 0.24 - 0.1 - 4 x 4 ms = 124 prompt tokens (to the agent's, the 32-token floor).
    assert of("long", step(s)) == 124
    assert s.unreachable == {"agent": 1}


def test_a_step_carries_the_tightest_classs_decodes_first_when_it_cannot_carry_all():
    s = scheduler(max_num_seqs=64)
    agent = [request("agent", 16, max_tokens=100, slo=AGENT) for _ in range(20)]
    chat = [request("chat", 16, max_tokens=100, slo=CHAT) for _ in range(20)]
    for r in chat + agent:
        s.add_request(r)
    decoding(s, *agent, *chat)
    # The agent's 0.12 s: (0.12 - 0.04) / 4 ms = 20 decodes, all the agent's.
    tokens = step(s)
    assert of("agent", tokens) == 20 and of("chat", tokens) == 0


def test_with_one_class_the_steps_are_the_single_slo_schedulers_step_for_step():
    """A randomized workload of one class (and of none) against classes off: the same steps."""
    for seed in range(6):
        rng = random.Random(seed)
        plan = [(rng.choice("abcd"), rng.choice([16, 40, 300, 1500]), rng.choice([4, 16, 60]),
                 rng.randrange(3)) for _ in range(30)]
        one = SloTargets("standard", ttft_s=2.5, tpot_s=0.3) if seed % 2 else None
        runs = []
        for classes in (True, False):
            s = scheduler(max_num_seqs=24, slo_classes=classes)
            steps, k = [], 0
            for i in range(60):
                while k < len(plan) and plan[k][3] <= i % 3 and k < 2 * i + 2:
                    tenant, prompt, out, _ = plan[k]
                    s.add_request(request(f"{tenant}{seed}", prompt, max_tokens=out, arrival=float(k), slo=one))
                    k += 1
                steps.append(sorted((rid.rsplit("-", 1)[0], n) for rid, n in step(s).items()))
            runs.append(steps)
        assert runs[0] == runs[1], seed


# -- prefill by TTFT slack, within the fairness bound -----------------------------------------------
def work(tenant: str, remaining: int, ttft: float | None, arrival: float = 0.0) -> PromptWork:
    return PromptWork(key=tenant, tenant=tenant, tier=0, remaining=remaining, running=False, arrival=arrival,
                      ttft_s=ttft)


def test_prefill_goes_by_ttft_slack_when_two_classes_wait():
    counters = TenantCounters()
    waiting = [work("doc", 3000, 2.5), work("complete", 150, 1.0, arrival=0.5)]
    plan = plan_step(["chat"], waiting, counters, 184, 2000, 32, now=1.0, slack_bound=1.0)
    # The interactive request (0.5 s of slack against the document's 1.5 s) takes all it needs first.
    assert plan.order[0] == "complete" and plan.shares["complete"] == 150 and plan.shares["doc"] == 34
    # Without the order by slack (the bound off), the two share the budget: 92 each, by counter.
    even = plan_step(["chat"], waiting, counters, 184, 2000, 32, now=1.0, slack_bound=None)
    assert even.shares["complete"] == 92


def test_the_order_by_slack_keeps_within_the_fairness_bound():
    counters = TenantCounters()
    counters.charge("complete", 1.5)  # served 1.5 engine-seconds more than the document tenant
    waiting = [work("doc", 3000, 2.5), work("complete", 150, 1.0, arrival=0.5)]
    plan = plan_step(["chat"], waiting, counters, 184, 2000, 32, now=1.0, slack_bound=1.0)
    # Past the bound it waits its turn by counter: the tenant within it (by slack too) goes first.
    assert plan.order[0] == "doc" and plan.shares["doc"] == 184 and "complete" in plan.held
    # Within a larger bound, slack orders it again.
    plan = plan_step(["chat"], waiting, counters, 184, 2000, 32, now=1.0, slack_bound=2.0)
    assert plan.shares["complete"] == 150


def test_a_prompt_past_its_target_does_not_take_the_budget_from_one_that_can_still_meet_its_own():
    counters = TenantCounters()
    waiting = [work("doc", 3000, 2.5, arrival=-5.0), work("complete", 150, 1.0, arrival=0.5)]  # doc: 6 s waited
    plan = plan_step(["chat"], waiting, counters, 184, 2000, 32, now=1.0, slack_bound=1.0)
    assert plan.order[0] == "complete" and plan.shares["complete"] == 150


def test_one_ttft_target_waiting_keeps_vtcs_order():
    counters = TenantCounters()
    counters.charge("complete", 0.5)
    waiting = [work("doc", 3000, 2.5), work("complete", 150, 2.5, arrival=0.5)]
    plan = plan_step(["chat"], waiting, counters, 184, 2000, 32, now=1.0, slack_bound=1.0)
    assert plan.order[0] == "doc" and plan.shares["complete"] == 92


def test_the_interactive_request_beside_a_long_prompt_gets_its_prompt_in_one_step():
    def first_step(classes: bool) -> int:
        s = scheduler(slo_classes=classes)
        chat = request("chat", 16, max_tokens=64, slo=CHAT)
        s.add_request(chat)
        decoding(s, chat)
        s.add_request(request("doc", 3000, slo=CHAT, arrival=time.time()))
        step(s)
        complete = request("complete", 150, slo=INTERACTIVE, arrival=time.time())  # vLLM's clock
        s.add_request(complete)
        return step(s).get(complete.request_id, 0)

    assert first_step(True) == 150  # 0.24 - 0.04 - 4 ms = 196 prompt tokens: its 150 first
    assert first_step(False) == 98  # by counter: half of them, and a second step for the rest


def test_a_class_without_a_ttft_target_leaves_the_step_to_a_class_with_one():
    bulk = SloTargets("batch")  # no targets at all: throughput only

    def first_step(doc_class) -> int:
        s = scheduler()
        chat = request("chat", 16, max_tokens=64, slo=INTERACTIVE)
        s.add_request(chat)
        decoding(s, chat)
        s.add_request(request("doc", 3000, slo=doc_class, arrival=time.time()))
        step(s)
        complete = request("complete", 150, slo=INTERACTIVE, arrival=time.time())
        s.add_request(complete)
        return step(s).get(complete.request_id, 0)

    assert first_step(bulk) == 150  # the batch class is a class of its own, after every TTFT target
    assert first_step(None) == 98  # beside work of no class, one TTFT target waits: by counter


# -- shedding by class ------------------------------------------------------------------------------
def test_a_full_queue_sheds_the_class_with_the_most_slack_first():
    q = FairQueue(FairQueueConfig(newcomer_slots=0, max_queued=2), FixedLimit(1), 8)
    q.submit(Entry("x"))  # runs: the rest queue
    batch = Entry("bulk", ttft_s=None)  # a class with no latency target (batch work)
    chat = Entry("chat", ttft_s=2.5)
    q.submit(batch)
    q.submit(chat)
    q.charge("chat", 0, 1000)  # chat is further over its share by counter: the class decides first
    complete = Entry("complete", ttft_s=1.0)
    q.submit(complete)
    assert batch.state == "refused" and chat.state == "queued" and complete.state == "queued"
    agent = Entry("agent", ttft_s=5.0)
    q.submit(agent)  # a tenant with nothing queued is never refused: of those queued, chat has more slack
    assert agent.state == "queued" and chat.state == "refused" and complete.state == "queued"


def test_shedding_by_class_stays_within_a_priority():
    q = FairQueue(FairQueueConfig(newcomer_slots=0, max_queued=1), FixedLimit(1), 8)
    q.submit(Entry("x"))
    low = Entry("low", priority=0, ttft_s=1.0)
    q.submit(low)
    q.submit(Entry("top", priority=100, ttft_s=None))
    assert low.state == "refused"


# -- the class is the platform's, never the client's ------------------------------------------------
def test_a_client_cannot_set_its_class_by_its_own_vllm_args():
    call = EngineCall("r1", tenant_id="t", slo=None)
    sent = {"loraplex_slo_class": "interactive", "loraplex_ttft_s": 0.01, "loraplex_tpot_s": 0.01,
            "loraplex_tenant": "other", "mine": 1}
    args = engine_args(sent, call)
    assert args["loraplex_tenant"] == "t" and args["mine"] == 1
    assert not {"loraplex_slo_class", "loraplex_ttft_s", "loraplex_tpot_s"} & set(args)
    args = engine_args(sent, EngineCall("r2", tenant_id="t", slo=CHAT))
    assert (args["loraplex_slo_class"], args["loraplex_ttft_s"], args["loraplex_tpot_s"]) == ("chat", 2.5, 0.3)


def test_a_class_without_a_tpot_target_does_not_size_the_step():
    s = scheduler()
    ttft_only = SloTargets("complete", ttft_s=1.0)  # no TPOT target: the agent's decides
    a = [request("a", 16, max_tokens=64, slo=ttft_only) for _ in range(2)]
    b = [request("agent", 16, max_tokens=64, slo=AGENT) for _ in range(2)]
    for r in a + b:
        s.add_request(r)
    decoding(s, *a, *b)
    s.add_request(request("long", 3000, slo=ttft_only))
    assert of("long", step(s)) == 64  # 0.12 - 0.04 - 4 x 4 ms, as the agent's class alone
