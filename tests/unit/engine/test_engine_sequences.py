"""The Engine replica counts sequences (EngineCall.sequences: n x prompts), not requests, for its
shedder and its fair queue (issue 34), over the fake vLLM of test_engine_replica."""

from __future__ import annotations

import asyncio

from test_engine_replica import Script, chat, drain, llm, make_call, start_replica


async def settle():
    for _ in range(20):
        await asyncio.sleep(0)


async def test_the_shedder_counts_a_requests_sequences(tmp_path):
    replica = await start_replica(tmp_path, fair_queue={"enabled": False},
                                  shedding={"shed_requests": 4, "max_requests": 8})
    llm(replica).script = Script(tokens=3, stall_after=1)  # the first request holds its sequences
    try:
        held = asyncio.create_task(drain(replica.generate(make_call("wide", sequences=4), chat())))
        await settle()
        assert replica.in_flight.total == 4
        [refused] = await drain(replica.generate(make_call("next"), chat()))
        assert refused.status == 503 and refused.reason == "shed"  # 4 sequences in flight: priority 0 is shed
        # ... for the tenant holding them; a neighbour under its share (2 of 4) is served beside them.
        neighbour = asyncio.create_task(drain(replica.generate(make_call("neighbour", tenant="ten_b", sequences=2),
                                                               chat())))
        await settle()
        assert replica.in_flight.total == 6 and replica.in_flight.sequences == {"ten_a": 4, "ten_b": 2}
        llm(replica).gate.set()
        await held
        assert (await neighbour)[-1].data.endswith(b"data: [DONE]\n\n")
        assert replica.in_flight.total == 0
    finally:
        llm(replica).gate.set()
        await replica.__del__()


async def test_the_fair_queue_gives_a_call_as_many_slots_as_its_sequences(tmp_path):
    replica = await start_replica(tmp_path, fair_queue={"dispatch_limit": 4, "newcomer_slots": 0})
    llm(replica).script = Script(tokens=3, stall_after=1)
    try:
        wide = asyncio.create_task(drain(replica.generate(make_call("wide", tenant="ten_w", sequences=3), chat())))
        await settle()
        two = asyncio.create_task(drain(replica.generate(make_call("two", tenant="ten_m", sequences=2), chat())))
        await settle()
        assert replica.fair_queue.running == 3 and replica.fair_queue.queued == 1  # 3 + 2 > 4: it waits
        llm(replica).gate.set()
        await asyncio.gather(wide, two)
        assert replica.fair_queue.running == 0
    finally:
        llm(replica).gate.set()
        await replica.__del__()
