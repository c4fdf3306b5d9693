"""The Engine replica's fair queue over the fake vLLM of test_engine_replica: what reaches vLLM,
when, and what a refused request costs (nothing: a refusal, never a usage record)."""

from __future__ import annotations

import asyncio
import time

import pytest

from test_engine_replica import Script, chat, drain, ledger_rows, llm, make_call, start_replica


@pytest.fixture
async def make(tmp_path):
    replicas = []

    async def start(**fair_queue):
        replica = await start_replica(tmp_path, fair_queue=fair_queue)
        llm(replica).script = Script(tokens=3, stall_after=1)  # every request holds its slot
        replicas.append(replica)
        return replica
    yield start
    for replica in replicas:
        llm(replica).gate.set()
        await replica.__del__()


def in_vllm(replica) -> list[str]:
    return [request_id.split("-")[1] for request_id, _, _ in llm(replica).generate_calls]  # cmpl-<id>-0


async def settle():
    for _ in range(20):
        await asyncio.sleep(0)


async def test_the_dispatch_limit_holds_requests_out_of_vllm_and_a_newcomer_slot_starts_one(make):
    replica = await make(dispatch_limit=1, newcomer_slots=1)
    w = [asyncio.create_task(drain(replica.generate(make_call(f"w{i}", tenant="ten_w"), chat()))) for i in range(3)]
    await settle()
    assert in_vllm(replica) == ["w0"]  # the limit: one in vLLM, two queued
    m = asyncio.create_task(drain(replica.generate(make_call("m0", tenant="ten_m"), chat())))
    await settle()
    assert in_vllm(replica) == ["w0", "m0"]  # nothing running for ten_m: its slot at once
    assert replica.fair_queue.snapshot()["tenants"]["ten_w"]["queued"] == 2
    llm(replica).gate.set()
    await asyncio.gather(*w, m)
    assert sorted(in_vllm(replica)) == ["m0", "w0", "w1", "w2"]
    assert len(ledger_rows(replica)) == 4  # every one that ran is billed once


async def test_without_the_queue_every_request_goes_to_vllm_at_once(make):
    replica = await make(enabled=False)
    assert replica.fair_queue is None
    tasks = [asyncio.create_task(drain(replica.generate(make_call(f"w{i}", tenant="ten_w"), chat()))) for i in range(3)]
    await settle()
    assert in_vllm(replica) == ["w0", "w1", "w2"]
    llm(replica).gate.set()
    await asyncio.gather(*tasks)


async def test_a_full_queue_refuses_the_tenant_over_its_share_never_billed(make):
    replica = await make(dispatch_limit=1, newcomer_slots=0, max_queued=1, retry_after_s=7)
    w = [asyncio.create_task(drain(replica.generate(make_call(f"w{i}", tenant="ten_w"), chat()))) for i in range(2)]
    await settle()
    [refused] = await drain(replica.generate(make_call("w2", tenant="ten_w"), chat()))
    assert (refused.status, refused.reason, refused.retry_after) == (503, "fair_share", 7)
    m = asyncio.create_task(drain(replica.generate(make_call("m0", tenant="ten_m"), chat())))
    await settle()
    [evicted] = await w[1]  # ten_w's queued request made room for ten_m, which had nothing queued
    assert evicted.reason == "fair_share" and not evicted.billed
    llm(replica).gate.set()
    await asyncio.gather(w[0], m)
    assert sorted(r["request_id"] for r in ledger_rows(replica)) == ["m0", "w0"]


async def test_a_queued_request_that_cannot_start_by_its_deadline_is_refused_not_billed(make):
    replica = await make(dispatch_limit=1, deadline_margin_s=0.2)
    w0 = asyncio.create_task(drain(replica.generate(make_call("w0", tenant="ten_w"), chat())))
    await settle()
    started = time.monotonic()
    [refused] = await drain(replica.generate(make_call("w1", tenant="ten_w", deadline=time.time() + 0.5), chat()))
    assert refused.status == 503 and refused.reason == "queue_deadline"
    assert 0.2 < time.monotonic() - started < 2.0  # at deadline - margin, not at the deadline
    assert "w1" not in in_vllm(replica) and replica.fair_queue.queued == 0
    llm(replica).gate.set()
    await w0
    assert [r["request_id"] for r in ledger_rows(replica)] == ["w0"]


async def test_a_cancelled_wait_leaves_the_queue_at_once(make):
    replica = await make(dispatch_limit=1)
    w0 = asyncio.create_task(drain(replica.generate(make_call("w0", tenant="ten_w"), chat())))
    await settle()
    w1 = asyncio.create_task(drain(replica.generate(make_call("w1", tenant="ten_w"), chat())))
    await settle()
    assert replica.fair_queue.queued == 1
    w1.cancel()  # the client went away
    await settle()
    assert replica.fair_queue.queued == 0
    llm(replica).gate.set()
    await w0
    assert in_vllm(replica) == ["w0"] and [r["request_id"] for r in ledger_rows(replica)] == ["w0"]


async def test_tokens_served_are_charged_to_the_tenant_by_its_weight(make):
    replica = await make(dispatch_limit=4)
    llm(replica).gate.set()
    await drain(replica.generate(make_call("a", tenant="ten_a"), chat()))
    await drain(replica.generate(make_call("b", tenant="ten_b", weight=2.0), chat()))
    counters = {n: t.counter for n, t in replica.fair_queue.tenants.items()}
    # prompt 7 x 1 + completion 3 x 2 = 13; halved by weight 2
    assert counters == {"ten_a": 13.0, "ten_b": 6.5}


async def test_the_replica_status_shows_the_queue(make):
    replica = await make(dispatch_limit=1, newcomer_slots=0)
    tasks = [asyncio.create_task(drain(replica.generate(make_call(f"w{i}", tenant="ten_w"), chat()))) for i in range(2)]
    await settle()
    status = replica.replica_status()
    assert status["dispatch_limit"] == 1 and status["dispatched"] == 1 and status["queued"] == 1
    assert status["tenants"]["ten_w"]["queued"] == 1
    stats = await replica.record_routing_stats()
    assert stats["queued"] == 1 and stats["status"]["tenants"]["ten_w"]["running"] == 1
    llm(replica).gate.set()
    await asyncio.gather(*tasks)


def test_the_adaptive_limit_is_fed_each_finished_requests_tpot_only():
    # TPOT is what the batch size sets; TTFT is not fed (a limit judged on it backed off on a
    # closed loop's refills and turned their wait into queue wait: dispatch_limit.py).
    from loraplex.config import PlatformConfig
    from loraplex.contract import RequestUsage
    from loraplex.engine.deployment import Engine
    from loraplex.engine.fair_queue import Entry

    replica = Engine.__new__(Engine)
    replica.fair_queue = Engine._fair_queue(PlatformConfig.from_args({}))  # adaptive: no dispatch_limit
    seen = []
    replica.fair_queue.limit.observe = seen.append
    for tokens, status in ((11, "stop"), (1, "length"), (11, "abort")):
        entry = Entry("ten_a")
        replica.fair_queue.submit(entry)
        usage = RequestUsage(status=status, completion_tokens=tokens, scheduled_time=103.0,
                             first_token_time=103.5, finish_time=104.5)
        replica._slot_freed(entry, usage)
    # 10 tokens after the first in 1 s; a one-token request has no TPOT; an aborted one is not judged
    assert seen == [pytest.approx(0.1)]
    assert replica.fair_queue.running == 0


async def test_prefill_pacing_holds_a_tenants_next_request_until_its_first_token(make):
    replica = await make(dispatch_limit=4, newcomer_slots=0, max_prefilling_per_tenant=1)
    llm(replica).script = Script(tokens=3, stall_after=0)  # no first token until the gate opens
    m = asyncio.create_task(drain(replica.generate(make_call("m0", tenant="ten_m"), chat())))
    await settle()
    w = [asyncio.create_task(drain(replica.generate(make_call(f"w{i}", tenant="ten_w"), chat()))) for i in range(2)]
    await settle()
    # ten_m is active: w1 waits for w0's first token, though slots are free; ten_w's prefill
    # never held ten_m
    assert in_vllm(replica) == ["m0", "w0"]
    assert replica.fair_queue.snapshot()["tenants"]["ten_w"] == {**replica.fair_queue.snapshot()["tenants"]["ten_w"],
                                                                 "queued": 1, "prefilling": 1}
    llm(replica).gate.set()
    await asyncio.gather(*w, m)
    assert in_vllm(replica) == ["m0", "w0", "w1"]  # the first token (the engine's usage hook) let it go
    assert len(ledger_rows(replica)) == 3


async def test_a_batch_line_waits_in_the_batch_tier_and_yields_to_online_work(make):
    replica = await make(dispatch_limit=2, newcomer_slots=0, batch_max_share=0.5)
    b = [asyncio.create_task(drain(replica.generate(make_call(f"b{i}", tenant="ten_b", batch=True), chat())))
         for i in range(2)]
    await settle()
    assert in_vllm(replica) == ["b0"]  # half the limit: the other slot is online work's
    snap = replica.fair_queue.snapshot()
    assert (snap["batch_running"], snap["batch_queued"]) == (1, 1) and "ten_b" not in snap["tenants"]
    o = [asyncio.create_task(drain(replica.generate(make_call(f"o{i}", tenant="ten_o"), chat()))) for i in range(2)]
    await settle()
    assert in_vllm(replica) == ["b0", "o0"]  # the free slot went to the online request at once
    llm(replica).gate.set()
    await asyncio.gather(*b, *o)
    assert in_vllm(replica).index("o1") < in_vllm(replica).index("b1")  # queued online work first


async def test_a_queued_request_of_a_dead_ingress_leaves_the_queue_and_never_runs(make):
    """Issue 48: a killed Ingress replica's queued call left the queue only when dispatched, then
    generated for no one until the next caller check."""
    replica = await make(dispatch_limit=1, newcomer_slots=0)
    dead: set[str] = set()
    replica.callers.period_s, replica.callers.is_alive = 0.01, (lambda name: name not in dead)
    w0 = asyncio.create_task(drain(replica.generate(make_call("w0", tenant="ten_w", caller="ingress-b"), chat())))
    w1 = asyncio.create_task(drain(replica.generate(make_call("w1", tenant="ten_w", caller="ingress-a"), chat())))
    await settle()
    assert in_vllm(replica) == ["w0"] and replica.fair_queue.snapshot()["tenants"]["ten_w"]["queued"] == 1
    dead.add("ingress-a")
    await asyncio.wait({w1}, timeout=5)
    assert w1.cancelled()  # its caller's death cancelled it in the queue
    assert replica.fair_queue.snapshot()["tenants"].get("ten_w", {}).get("queued", 0) == 0
    llm(replica).gate.set()
    await w0
    assert in_vllm(replica) == ["w0"]  # w1 never reached vLLM
    assert [r["request_id"] for r in ledger_rows(replica)] == ["w0"]  # and is not billed


async def test_with_slo_classes_on_the_queue_admits_by_ttft_slack_from_the_ingress_arrival(tmp_path):
    """The switch reaches the replica's queue, the wait before it (EngineCall.arrival_time) counts,
    and a class without a TTFT target waits as a class of its own."""
    from dataclasses import replace

    from loraplex.contract import SloTargets
    from loraplex.engine.config import TenantSchedulerConfig

    classes = {"chat": SloTargets("chat", ttft_s=2.5), "interactive": SloTargets("interactive", ttft_s=1.0),
               "batch": SloTargets("batch")}

    async def order(on: bool, *queued: tuple[str, str, float]) -> list[str]:
        """The order vLLM got w0 (holding the one slot) and the queued (id, class, seconds since the ingress got it)."""
        replica = await start_replica(tmp_path / str(len(list(tmp_path.iterdir()))),
                                      engine_config={"tenant_scheduler": TenantSchedulerConfig(slo_classes=on)},
                                      fair_queue={"dispatch_limit": 1, "newcomer_slots": 0})
        llm(replica).script = Script(tokens=3, stall_after=1)
        now = time.time()
        calls = [make_call("w0", tenant="ten_w")] + [
            replace(make_call(rid, tenant=f"ten_{rid}", slo=classes[name]), arrival_time=now - waited)
            for rid, name, waited in queued]
        tasks = []
        for call in calls:
            tasks.append(asyncio.create_task(drain(replica.generate(call, chat()))))
            await settle()
        llm(replica).gate.set()
        await asyncio.gather(*tasks)
        await replica.__del__()
        return in_vllm(replica)

    # Counters tied: by slack (1 s against 2.5 s) with classes on, in arrival order with them off.
    assert await order(True, ("c0", "chat", 0.0), ("i0", "interactive", 0.0)) == ["w0", "i0", "c0"]
    assert await order(False, ("c0", "chat", 0.0), ("i0", "interactive", 0.0)) == ["w0", "c0", "i0"]
    # 2 s in the ingress already: 0.5 s of slack left.
    assert await order(True, ("c0", "chat", 2.0), ("i0", "interactive", 0.0)) == ["w0", "c0", "i0"]
    # The batch class (no targets) after a class with one.
    assert await order(True, ("b0", "batch", 0.0), ("i0", "interactive", 0.0)) == ["w0", "i0", "b0"]
