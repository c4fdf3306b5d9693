"""TenantScheduler: vLLM 0.32's own Scheduler with the tenant step plan, driven step by step with
fake model outputs and fake step costs (no model runs; the KV cache is a bookkeeping object).

Each test states one rule of docs/operations.md's tenant scheduler and fails without it:
decodes first, a shared step's prompt budget from the TPOT target, the split across tenants,
the newcomer in the next step, one tenant alone untouched.
"""

from __future__ import annotations

import pytest
from vllm.v1.core.sched.scheduler import Scheduler

from bench.fake_steps import fake_request as request
from bench.fake_steps import fake_step as step
from bench.fake_steps import make_scheduler
from loraplex.engine.config import TenantSchedulerConfig
from loraplex.engine.step_cost import Coefficients
from loraplex.engine.step_plan import MAX_HELD_STEPS
from loraplex.engine.tenant_scheduler import CONFIG_KEY, TenantScheduler

from model_dir import default_model_dir

TOKEN_BUDGET = 2048
# Fake step costs: 40 ms a step, 4 ms a decode, 1 ms a prompt token. A 0.3 s TPOT target at
# step_share 0.8 (0.24 s) leaves a step with 4 decodes 0.184 s: 184 prompt tokens.
COSTS = Coefficients(base_s=0.04, per_decode_s=0.004, per_prompt_s=0.001)


def scheduler(cls=TenantScheduler, max_loras: int | None = None, max_num_seqs: int = 16, **settings) -> Scheduler:
    config = TenantSchedulerConfig(tpot_s=0.3, **settings)
    s = make_scheduler(cls, str(default_model_dir()), {CONFIG_KEY: config.settings()}, token_budget=TOKEN_BUDGET,
                       max_loras=max_loras, max_num_seqs=max_num_seqs)
    if cls is TenantScheduler:
        s.cost.prior = COSTS  # the fit would replace it only after min_steps real steps
        s.cost.min_steps = 10**9
    return s


def of(tenant: str, tokens: dict[str, int]) -> int:
    return sum(n for rid, n in tokens.items() if rid.startswith(tenant + "-"))


def streams(s: Scheduler, **counts: int) -> dict[str, list[Request]]:
    """Each named tenant's `count` 16-token requests of 100 output tokens, added in that order and
    run past their prefill."""
    made = {tenant: [request(tenant, 16, max_tokens=100) for _ in range(n)] for tenant, n in counts.items()}
    every = [r for rs in made.values() for r in rs]
    for r in every:
        s.add_request(r)
    decoding(s, *every)
    return made


def decoding(s: Scheduler, *requests: Request) -> None:
    """Run until every one of these is past its prefill."""
    for _ in range(50):
        if all(r.num_computed_tokens >= r.num_prompt_tokens for r in requests):
            return
        step(s)
    raise AssertionError("requests never finished their prefill")


def test_one_tenant_alone_runs_vllms_own_steps():
    a, b = scheduler(), scheduler(cls=Scheduler)
    for s in (a, b):
        for _ in range(3):
            s.add_request(request("solo", 1500, arrival=0.0))
    counts_a = [sorted(step(a).values()) for _ in range(8)]
    counts_b = [sorted(step(b).values()) for _ in range(8)]
    assert counts_a == counts_b
    assert max(sum(c) for c in counts_a) == TOKEN_BUDGET  # uncapped: the whole token budget


def test_a_shared_step_carries_only_the_prompt_tokens_the_tpot_target_allows():
    s = scheduler()
    chat = [request("chat", 16, max_tokens=64) for _ in range(4)]
    for r in chat:
        s.add_request(r)
    decoding(s, *chat)
    s.add_request(request("long", 3000))
    tokens = step(s)
    # 4 decodes + 184 prompt tokens (0.24 s - 0.04 s - 4 x 4 ms, at 1 ms a token).
    assert of("chat", tokens) == 4
    assert of("long", tokens) == 184
    # vLLM's own scheduler puts the whole token budget's prompt tokens in that step.
    v = scheduler(cls=Scheduler)
    chat = [request("chat", 16, max_tokens=64) for _ in range(4)]
    for r in chat:
        v.add_request(r)
    decoding(v, *chat)
    v.add_request(request("long", 3000))
    assert of("long", step(v)) == TOKEN_BUDGET - 4


def test_decodes_go_first_even_behind_a_running_long_prefill():
    def run(cls):
        s = scheduler(cls=cls)
        long = request("long", 6000, arrival=0.0)
        s.add_request(long)
        step(s)  # alone: a 2048-token chunk; it is now mid-prefill in vLLM's running list, ahead of...
        chat = request("chat", 16, max_tokens=64, arrival=1.0)
        s.add_request(chat)
        for _ in range(3):
            step(s)
        return [step(s).get(chat.request_id, 0) for _ in range(3)]

    # ...the chat request, whose decode is never crowded out: its token is in the step's budget
    # before any prompt token (the order and the budget's reserve both see to it).
    assert run(TenantScheduler) == [1, 1, 1]


def test_a_shared_steps_decodes_fit_the_target_the_light_tenants_all_the_heavy_ones_oldest():
    s = scheduler(max_num_seqs=64)
    heavy = streams(s, heavy=60, chat=2)["heavy"]
    first, second = step(s), step(s)
    # 62 decodes would take 0.04 + 62 x 4 ms = 0.288 s, past the 0.24 s target: 50 fit.
    assert sum(first.values()) == 50 and sum(second.values()) == 50
    assert of("chat", first) == 2 and of("chat", second) == 2  # the light tenant's, every step
    oldest = {r.request_id for r in heavy[:48]}  # of the heavy one's, its oldest: they finish
    assert oldest <= set(first) and oldest <= set(second)
    # Alone, the heavy tenant's steps are vLLM's own: all its decodes at once.
    alone = scheduler(max_num_seqs=64)
    streams(alone, heavy=60)
    assert sum(step(alone).values()) == 60


def test_a_target_the_step_cost_cannot_reach_holds_no_decode_and_carries_the_least_prompt_work():
    """A slow CPU: a step's fixed cost 0.2 s, so one decode and the 32-token floor (0.344 s) overrun
    the 0.24 s target. The step carries the floor's prompt tokens beside every decode: held to fit,
    the decodes were cut to one a step; unsized, a neighbour's long prompts made 9 s steps."""
    slow = Coefficients(base_s=0.2, per_decode_s=0.002, per_prompt_s=0.0045)
    s = scheduler(max_num_seqs=64)
    s.cost.prior = slow
    streams(s, heavy=60, chat=2)
    s.add_request(request("long", 3000))
    tokens = step(s)
    assert of("heavy", tokens) + of("chat", tokens) == 62  # no decode held
    assert of("long", tokens) == 32  # min_prompt_tokens


def test_prompt_work_takes_no_room_from_the_first_tenants_decodes():
    """The fit of a CPU without bf16 (0.073 s + 18 ms a decode + 4.6 ms a prompt token): one decode
    and the 32-token floor fill the 0.24 s target, so a decode cap that kept room for the floor held
    two of the chat tenant's three streams every step a neighbour's document waited (its TPOT 1.5 s
    on the real engine, beside 32 tokens of the document). The first tenant's decodes all run, and
    of a heavier tenant's as many (max-min): the step carries the floor beside them (0.33 s, not
    the 0.49 s of all 15), the heavier tenant's other decodes wait."""
    s = scheduler(max_num_seqs=64)
    s.cost.prior = Coefficients(base_s=0.073, per_decode_s=0.018, per_prompt_s=0.0046)
    streams(s, chat=3, heavy=12)
    s.counters.charge("heavy", 10.0)  # the heavier: ranked after chat
    s.add_request(request("long", 3000))
    tokens = step(s)
    assert of("chat", tokens) == 3 and of("heavy", tokens) == 3 and of("long", tokens) == 32


def test_no_decode_is_held_where_the_steps_fixed_cost_is_past_half_its_target():
    """0.2 s before any token against a 0.24 s target: one decode alone is in reach, but holding 30 of
    50 decodes would make a 0.3 s step 0.24 s at 0.4x the tokens: every decode runs."""
    s = scheduler(max_num_seqs=64)
    s.cost.prior = Coefficients(base_s=0.2, per_decode_s=0.002, per_prompt_s=0.0045)
    streams(s, heavy=48, chat=2)
    assert sum(step(s).values()) == 50


def test_the_budget_is_split_across_tenants_and_a_long_prompt_is_chunked():
    s = scheduler(min_prompt_tokens=16)
    chat = request("chat", 16, max_tokens=64)
    s.add_request(chat)
    decoding(s, chat)
    s.add_request(request("a", 3000))
    s.add_request(request("b", 3000))
    tokens = step(s)
    # 1 decode: 0.24 - 0.04 - 0.004 = 0.196 s -> 196 prompt tokens, 98 each.
    assert of("a", tokens) == 98 and of("b", tokens) == 98
    # The split is by counter: the one served more so far gets no more than the other over time.
    totals = {"a": 0, "b": 0}
    for _ in range(10):
        t = step(s)
        totals["a"] += of("a", t)
        totals["b"] += of("b", t)
    assert abs(totals["a"] - totals["b"]) <= 98


def test_a_newcomer_is_scheduled_in_the_next_step():
    s = scheduler()
    chat = request("chat", 16, max_tokens=200)
    s.add_request(chat)
    decoding(s, chat)
    for _ in range(4):
        s.add_request(request("long", 3000))
    for _ in range(5):
        step(s)  # long's prompts are being chunked beside chat's decodes
    newcomer = request("new", 24)
    s.add_request(newcomer)
    tokens = step(s)
    assert tokens.get(newcomer.request_id) == 24  # its whole short prompt, in the very next step


def test_the_scheduler_charges_each_tenant_the_engine_seconds_it_got():
    s = scheduler()
    chat = request("chat", 16, max_tokens=64)
    s.add_request(chat)
    decoding(s, chat)
    chat_counter = s.counters.get("chat")
    s.add_request(request("long", 3000))
    assert s.counters.get("long") == chat_counter  # lifted to the lowest active counter on arrival
    step(s)
    # Then charged its share of the step: 196 prompt tokens (one decode beside it) and 196/197 of
    # the step's fixed part.
    assert s.counters.get("long") - chat_counter == pytest.approx(0.04 * 196 / 197 + 196 * 0.001, rel=1e-6)


def test_a_held_back_prompt_keeps_its_adapter_slot_from_another_adapter():
    s = scheduler(max_loras=1, min_prompt_tokens=200)  # a shared step serves one prompting tenant
    chat = request("chat", 16, max_tokens=200)
    s.add_request(chat)
    decoding(s, chat)
    a = request("a", 3000, lora=1)
    s.add_request(a)
    step(s)  # a is mid-prefill on adapter 1
    s.counters.charge("a", 100.0)  # now b is first by counter, and a's prefill is held back
    b = request("b", 3000, lora=2)
    s.add_request(b)
    for _ in range(5):
        tokens = step(s)  # vLLM asserts the running set never holds more adapters than max_loras
        assert b.request_id not in tokens
        running_loras = {r.lora_request.lora_int_id for r in s.running if r.lora_request}
        assert running_loras == {1}


def test_max_prompt_tokens_caps_every_step_a_lone_tenants_too():
    s = scheduler(max_prompt_tokens=256)
    s.add_request(request("solo", 3000))
    assert sum(step(s).values()) == 256


def test_a_chat_tenant_between_requests_finds_the_steps_still_sized():
    def after_chat(grace_s: float) -> int:
        s = scheduler(idle_grace_s=grace_s)
        for _ in range(3):
            s.add_request(request("long", 3000))
        chat = request("chat", 16, max_tokens=2)
        s.add_request(chat)
        for _ in range(4):
            step(s)
        assert chat.request_id not in s.requests  # done: only the long prompts are left
        return of("long", step(s))

    assert after_chat(60) < 400  # still a sized step: chat's next request may be on its way
    assert after_chat(0) == 2048  # no grace: the whole token budget at once


def batch_line(tenant: str, prompt: int, max_tokens: int = 8) -> Request:
    r = request(tenant, prompt, max_tokens=max_tokens)
    r.sampling_params.extra_args["loraplex_batch"] = True  # as VLLMEngine marks an EngineCall.batch
    return r


def test_batch_lines_pause_while_online_work_is_in_the_engine_and_go_on_after():
    def run(pause: bool) -> tuple[list[int], list[int], list[int]]:
        s = scheduler(pause_batch=pause)
        lines = [batch_line("acme", 16, max_tokens=40) for _ in range(2)]
        for r in lines:
            s.add_request(r)
        decoding(s, *lines)
        s.add_request(batch_line("acme", 16, max_tokens=40))  # a third line, not started yet
        chat = request("chat", 16, max_tokens=4)
        s.add_request(chat)
        beside, online = [], []
        while chat.request_id in s.requests:
            tokens = step(s)
            beside.append(of("acme", tokens))  # the batch lines' (their request ids are acme-<n>)
            online.append(tokens.get(chat.request_id, 0))
        after = [of("acme", step(s)) for _ in range(2)]
        return beside, online, after

    beside, online, after = run(pause=True)
    assert beside == [0] * len(beside)  # no batch token in any step the chat request is in
    assert online == [16, 1, 1, 1]  # its prompt, then a token a step: never held back
    assert all(n > 0 for n in after)  # and the lines go on once it is done
    beside, _, _ = run(pause=False)
    assert all(n >= 2 for n in beside)  # the running lines decode beside it


def test_requests_held_out_of_a_step_keep_their_slots():
    # Paused batch lines stay in vLLM's batch with their KV: a request admitted in their place
    # would make the batch larger than max_num_seqs once they are back.
    s = scheduler(max_num_seqs=3)
    lines = [batch_line("acme", 16, max_tokens=40) for _ in range(2)]
    for r in lines:
        s.add_request(r)
    decoding(s, *lines)
    first, second = request("chat", 16, max_tokens=8), request("chat", 16, max_tokens=8)
    s.add_request(first)
    s.add_request(second)
    for _ in range(3):
        tokens = step(s)
        assert len(s.running) <= 3
    assert first.request_id in tokens and second.request_id not in tokens  # waits for a slot


def test_no_decode_is_held_more_than_max_held_steps_in_a_row_while_its_tenant_has_a_share():
    # Issue 55: 10 streams of 6 tenants (4 with two, 2 with one) on a CPU where 5 decodes fill the
    # step target (0.04 s + 5 x 0.04 s = 0.24 s). Each tenant's oldest first, always, held the
    # newer stream of each two-stream tenant in every step until its older one ended.
    s = scheduler()
    s.cost.prior = Coefficients(base_s=0.04, per_decode_s=0.04, per_prompt_s=0.001)
    streams = [request(f"t{t}", 16, max_tokens=200, arrival=float(i))
               for i, t in enumerate([0, 0, 1, 1, 2, 2, 3, 3, 4, 5])]
    for r in streams:
        s.add_request(r)
    decoding(s, *streams)
    held = {r.request_id: 0 for r in streams}
    longest = dict(held)
    for _ in range(60):
        tokens = step(s)
        assert len(tokens) == 5  # the step target still holds: 5 decodes a step
        for rid in held:
            held[rid] = 0 if rid in tokens else held[rid] + 1
            longest[rid] = max(longest[rid], held[rid])
    # A tenant gets a decode in 5 steps of 6 (by counter), first to one held MAX_HELD_STEPS steps
    # in a row: no stream waits past that but for a step in which its tenant had none.
    assert max(longest.values()) <= MAX_HELD_STEPS + 1, longest
