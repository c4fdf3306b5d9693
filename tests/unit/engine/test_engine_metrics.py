"""What an Engine replica records, with the real replica classes over the fake vLLM of
test_engine_replica (see there) and a fake sink at Ray's edge: the per-tenant counters are the
ledger's rows, refusals say why, adapter loads and evictions are counted, gauges are published."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from loraplex.engine.deployment import Engine
from loraplex.metrics import catalog as c
from test_engine_replica import (ADAPTER, FakeAdapterStore, Script, VLLMEngineOverFakeVLLM, chat, drain, ledger_rows,
                                 llm, make_call, make_config)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "metrics"))
from fake_sink import FakeSink  # noqa: E402

OTHER_ADAPTER = ADAPTER.__class__("ten_a/other@def", 8, "ten_a", "other", "def", requested_as="other", version=1)


async def start(tmp_path, metrics: dict | None = None, update: dict | None = None, **deployment):
    sink = FakeSink()
    config = make_config(tmp_path, **deployment)
    if metrics:
        config = config.model_copy(update={"metrics": config.metrics.model_copy(update=metrics)})
    if update:
        config = config.model_copy(update=update)
    store = FakeAdapterStore(tmp_path)
    engine_cls = type("VLLMEngineOverFakeVLLM", (VLLMEngineOverFakeVLLM,), {"fake_store": store})
    replica = Engine.__new__(Engine)
    await replica.__init__(config, engine_cls=engine_cls, metrics_sink=sink)
    return replica, sink


@pytest.fixture
async def replica(tmp_path):
    replica, sink = await start(tmp_path, metrics={"publish_period_s": 3600})  # publish by hand
    yield replica, sink
    await replica.__del__()


async def test_per_tenant_counters_are_the_ledgers_rows(replica):
    replica, sink = replica
    llm(replica).script = Script(prompt_len=7, cached=4, tokens=5)
    await drain(replica.generate(make_call("r1"), chat()))
    await drain(replica.generate(make_call("r2", adapter=ADAPTER, stream=False), chat(stream=False, model="bot@2")))
    llm(replica).script = Script(prompt_len=9, cached=0, tokens=3, finish_reason="length")
    await drain(replica.generate(make_call("r3", tenant="ten_b"), chat()))
    rows = ledger_rows(replica)
    assert len(rows) == 3
    replica.metrics.flush()  # the publisher's every period
    for tenant in ("ten_a", "ten_b"):
        mine = [r for r in rows if r["tenant_id"] == tenant]
        for spec, column in ((c.PROMPT_TOKENS, "prompt_tokens"), (c.CACHED_PROMPT_TOKENS, "cached_prompt_tokens"),
                             (c.COMPLETION_TOKENS, "completion_tokens")):
            assert sink[spec.name].total(tenant=tenant) == sum(r[column] for r in mine), (tenant, spec.name)
        assert sink[c.REQUESTS.name].total(tenant=tenant) == len(mine)
        assert sink[c.TTFT.name].total(tenant=tenant) == len(mine)
        assert sink[c.E2E.name].total(tenant=tenant) == len(mine)
    assert sink[c.COMPLETION_TOKENS.name].total(tenant="ten_a", adapter="bot@2") == 5
    assert sink[c.REQUESTS.name].total(tenant="ten_b", status="length") == 1
    # The ledger's ttft and the histogram's observation are the same number.
    [r1] = [r for r in rows if r["request_id"] == "r1"]
    # Every record's base model is the replica's (engine.model_id), on its metrics too.
    assert {r["base_model"] for r in rows} == sink[c.PROMPT_TOKENS.name].label_values(c.MODEL) == {"base-model"}
    [ttft] = sink[c.TTFT.name].observations[((c.ADAPTER, c.BASE), (c.MODEL, "base-model"), (c.TENANT, "ten_a"))]
    assert ttft == pytest.approx(r1["ttft"])


async def test_a_refusal_is_never_a_request_and_a_shed_one_says_so(replica):
    replica, sink = replica
    replica.in_flight.add("ten_a", 1.0, 10_000)  # all the caller's own: over any share
    [refused] = await drain(replica.generate(make_call("r-shed"), chat()))
    replica.metrics.flush()
    assert refused.status == 503 and refused.reason == "shed"
    assert sink[c.REQUESTS.name].total() == 0 and ledger_rows(replica) == []


async def test_adapter_loads_are_counted_and_timed_and_evictions_by_reason(replica):
    replica, sink = replica
    fake, adapters = llm(replica), replica.engine.adapters
    await drain(replica.generate(make_call("r1", adapter=ADAPTER), chat(model="bot@2")))
    await drain(replica.generate(make_call("r2", adapter=ADAPTER), chat(model="bot@2")))
    assert fake.added_loras == [ADAPTER.lora_int_id]  # loaded into vLLM's host cache once
    assert sink[c.ADAPTER_LOADS.name].total() == 1 and sink[c.ADAPTER_LOAD_SECONDS.name].total() == 1
    # vLLM evicts it from its host cache (LRU): the next sample sees it, the next use loads it again.
    fake.resident_loras.discard(ADAPTER.lora_int_id)
    await replica._sample_adapters()
    assert sink[c.ADAPTER_EVICTIONS.name].total(reason="lru") == 1
    assert sink[c.LOADED_ADAPTERS.name].total(tier="cpu") == 0
    await drain(replica.generate(make_call("r3", adapter=ADAPTER), chat(model="bot@2")))
    assert fake.added_loras == [ADAPTER.lora_int_id] * 2 and sink[c.ADAPTER_LOADS.name].total() == 2
    await replica._sample_adapters()
    assert sink[c.LOADED_ADAPTERS.name].total(tier="cpu") == 1
    assert sink[c.ADAPTER_EVICTIONS.name].total(reason="lru") == 1  # not counted twice
    # A DELETE frees it: an eviction for that reason.
    await adapters.retire({ADAPTER.lora_int_id})
    assert sink[c.ADAPTER_EVICTIONS.name].total(reason="deleted") == 1


async def test_concurrent_first_uses_load_an_adapter_once(replica):
    import asyncio

    replica, sink = replica
    await asyncio.gather(*(drain(replica.generate(make_call(f"r{i}", adapter=OTHER_ADAPTER), chat(model="other")))
                           for i in range(5)))
    assert llm(replica).added_loras == [OTHER_ADAPTER.lora_int_id]
    assert sink[c.ADAPTER_LOADS.name].total() == 1


async def test_the_publisher_copies_engine_gauges_and_the_ledger_state(replica):
    replica, sink = replica
    await drain(replica.generate(make_call("r1"), chat()))
    replica.ledger.flush()
    replica._publish_engine_stats()
    replica._publish_ledger()
    assert c.KV_USAGE.name in sink.metrics and sink[c.KV_USAGE.name].series() == {((c.MODEL, "base-model"),)}
    assert sink[c.SPOOL_PENDING.name].total() == 0 and sink[c.SPOOL_LAST_FLUSH.name].total() > 0


async def test_the_publisher_thread_samples_adapters_on_the_replicas_loop(tmp_path):
    import asyncio

    replica, sink = await start(tmp_path, metrics={"publish_period_s": 0.05})
    try:
        for _ in range(200):  # the thread's first publish runs at once
            if sink[c.LOADED_ADAPTERS.name].label_values(c.TIER) >= {"cpu", "gpu"}:
                break
            await asyncio.sleep(0.01)
        assert sink[c.LOADED_ADAPTERS.name].total(tier="cpu") == 0
        assert sink[c.SPOOL_LAST_FLUSH.name].series() == {()}
    finally:
        await replica.__del__()


async def test_metrics_off_records_nothing_and_starts_no_publisher(tmp_path):
    replica, sink = await start(tmp_path, metrics={"enabled": False})
    try:
        await drain(replica.generate(make_call("r1", adapter=ADAPTER), chat(model="bot@2")))
        assert sink.metrics == {} and replica.publisher is None
        assert len(ledger_rows(replica)) == 1  # billing is unaffected
    finally:
        await replica.__del__()


async def test_a_load_that_ends_while_the_cache_is_listed_is_not_taken_for_an_eviction(replica):
    import time

    replica, sink = replica
    adapters = replica.engine.adapters
    asked_at = time.monotonic()
    listing = set(llm(replica).resident_loras)  # vLLM's answer, taken before the load below ends
    await drain(replica.generate(make_call("r1", adapter=ADAPTER), chat(model="bot@2")))
    assert adapters.note_resident(listing, asked_at) == 0
    assert adapters.note_resident(set(llm(replica).resident_loras), time.monotonic()) == 0
    assert ADAPTER.lora_name not in adapters.evicted


async def test_the_fair_queue_gauges_per_tenant_go_through_the_label_guard(tmp_path):
    import asyncio

    from test_engine_replica import Script

    replica, sink = await start(tmp_path, metrics={"publish_period_s": 3600, "max_tenant_labels": 1},
                                fair_queue={"dispatch_limit": 1, "newcomer_slots": 0})
    try:
        llm(replica).script = Script(tokens=3, stall_after=1)
        replica.metrics.requests.tenants.keep("ten_a")  # ten_a holds the one tenant label
        tasks = [asyncio.create_task(drain(replica.generate(make_call(f"{t}{i}", tenant=t), chat())))
                 for t in ("ten_a", "ten_b", "ten_c") for i in range(2)]
        for _ in range(20):
            await asyncio.sleep(0)
        replica._publish_fair_queue()
        assert sink[c.FAIR_QUEUE_LIMIT.name].total() == 1 and sink[c.FAIR_QUEUE_DISPATCHED.name].total() == 1
        lengths = sink[c.FAIR_QUEUE_LENGTH.name]
        assert lengths.label_values(c.TENANT) == {"ten_a", c.OTHER}  # ten_b and ten_c under `other`
        assert lengths.total(tenant="ten_a") == 1 and lengths.total(tenant=c.OTHER) == 4
        assert sink[c.FAIR_QUEUE_COUNTER.name].total(tenant="ten_a") > 0  # its running request's tokens
        llm(replica).gate.set()
        await asyncio.gather(*tasks)
        replica._publish_fair_queue()
        assert lengths.total() == 0  # drained: every tenant's series back to 0
    finally:
        llm(replica).gate.set()
        await replica.__del__()


async def test_the_publisher_asks_engine_core_for_the_unreachable_steps_only_with_classes_on(tmp_path):
    from types import SimpleNamespace

    from loraplex.engine.tenant_scheduler import UNREACHABLE_UTILITY

    asked = []

    async def call_utility_async(method, *args):
        asked.append(method)
        return {"interactive": 4}

    for classes in (False, True):
        replica, sink = await start(tmp_path / str(classes), metrics={"publish_period_s": 3600})
        try:
            scheduler = replica.engine.config.tenant_scheduler.model_copy(update={"enabled": True, "slo_classes": classes})
            replica.engine.config = replica.engine.config.model_copy(update={"tenant_scheduler": scheduler})
            llm(replica).engine_core = SimpleNamespace(call_utility_async=call_utility_async)
            before = len(asked)
            await asyncio.to_thread(replica._publish_unreachable)  # the publisher's thread; the call on the loop
            # (the publisher thread's own first publish may ask too: the same cumulative counts)
            assert set(asked[before:]) == ({UNREACHABLE_UTILITY} if classes else set())
            assert sink[c.UNREACHABLE_STEPS.name].total(slo_class="interactive") == (4 if classes else 0)
        finally:
            await replica.__del__()


async def test_each_scheduled_class_with_a_tpot_target_has_its_unreachable_series_from_the_start(tmp_path):
    from loraplex.config import PlatformConfig

    classes = PlatformConfig.from_args({
        "database_url": "sqlite://", "slo": {"classes": {"interactive": {"ttft_p95_s": 1.0, "tpot_p95_s": 0.3},
                                                      "agent": {"ttft_p95_s": 5.0, "tpot_p95_s": 0.2},
                                                      "batch": {}}},
        "engine": {"tenant_scheduler": {"enabled": True, "slo_classes": True}}})
    replica, sink = await start(tmp_path, metrics={"publish_period_s": 3600},
                                update={"slo": classes.slo, "engine": classes.engine})
    try:
        # At 0 before any count (an alert's rate() needs the series), and none for batch (no TPOT target).
        assert sink[c.UNREACHABLE_STEPS.name].label_values(c.SLO_CLASS) == {"interactive", "agent"}
        assert sink[c.UNREACHABLE_STEPS.name].total() == 0
    finally:
        await replica.__del__()
