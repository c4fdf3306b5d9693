"""The Engine replica around a fake engine: metering, served keys, routing stats, health checks."""

import time
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

import pytest
from sqlalchemy import select

from loraplex.accounting.tables import usage_records
from loraplex.config import PlatformConfig
from loraplex.engine.deployment import Engine
from loraplex.engine.protocol import AdapterTarget, RequestMeta, RequestUsage
from loraplex.engine.vllm_engine import ending_status


class FakeVLLMEngine:
    """Stands in for VLLMEngine: answers every request with 3 tokens and meters it."""

    def __init__(self, config, replica_id="", adapter_store=None):
        self.replica_id = replica_id
        self.adapters = SimpleNamespace(loaded_ids=lambda: [], targets={})
        self.probes_done = 0
        self.progress = 0.0

    async def start(self):
        pass

    async def chat(self, request, adapter=None, cache_salt=None, on_finish=None):
        yield {"choices": [{"message": {"content": "ok"}}]}
        now = time.time()
        usage = RequestUsage(prompt_tokens=10, cached_prompt_tokens=4, completion_tokens=3, finish_reason="stop",
                             replica_id=self.replica_id, first_token_time=now, finish_time=now, status="stop")
        if on_finish:
            on_finish(usage)
        yield usage

    completions = chat

    def last_progress(self):
        return self.progress

    async def probe(self):
        self.probes_done += 1
        self.progress = time.time()
        return 0.01

    async def shutdown(self):
        pass


@pytest.fixture
async def replica(tmp_path):
    config = PlatformConfig.from_args({
        "database_url": f"sqlite:///{tmp_path}/db.sqlite",
        "registry": {"store_url": str(tmp_path / "store"), "cache_dir": str(tmp_path / "cache")},
        "accounting": {"spool_dir": str(tmp_path / "spool")},
    })
    engine = Engine.__new__(Engine)
    await engine.__init__(config, engine_cls=FakeVLLMEngine)
    yield engine
    await engine.__del__()


async def drain(gen):
    return [item async for item in gen]


async def test_a_tenant_request_is_metered_once_with_its_context(replica):
    adapter = AdapterTarget("ten_a/bot@abc", 7, "ten_a", "bot", "abc", "bot", version=2)
    meta = RequestMeta("req-1", "ten_a", "key_1", adapter.label, time.time() - 1)
    request = SimpleNamespace(model="bot", messages=[{"role": "user", "content": "hi"}])
    await drain(replica.chat(request, adapter, "tenant:ten_a", meta))
    await drain(replica.chat(request, None, None, None))  # no meta (a direct handle call): not metered
    replica.ledger.flush()
    with replica.ledger.engine.connect() as conn:
        rows = conn.execute(select(usage_records)).all()
    assert len(rows) == 1
    row = rows[0]._asdict()
    assert row["request_id"] == "req-1" and row["tenant_id"] == "ten_a" and row["api_key_id"] == "key_1"
    assert row["adapter"] == "bot@2" and row["status"] == "stop" and row["replica_id"] == "local"
    assert (row["prompt_tokens"], row["cached_prompt_tokens"], row["completion_tokens"]) == (10, 4, 3)
    assert row["ttft"] == pytest.approx(1, abs=0.5)


async def test_routing_stats_report_the_keys_served_most_recent_first(replica):
    request = SimpleNamespace(model="base", messages=[])
    for tenant, adapter in (("ten_a", None), ("ten_b", AdapterTarget("x", 1, "ten_b", "bot", "s", "bot")),
                            ("ten_a", None)):
        await drain(replica.chat(request, adapter, None, RequestMeta(f"r-{time.time_ns()}", tenant)))
    stats = replica.record_routing_stats()
    assert stats["held_keys"] == ["ten_a", "ten_b/bot"]
    assert {"running", "waiting", "kv_usage"} <= set(stats)


async def test_health_check_probes_only_when_nothing_proved_the_engine_lately(replica):
    await replica.check_health()
    assert replica.engine.probes_done == 1
    await replica.check_health()  # the probe itself is recent progress
    assert replica.engine.probes_done == 1
    replica.engine.progress = time.time() - replica.ready_probe_max_age_s
    await replica.check_health()
    assert replica.engine.probes_done == 2


@pytest.mark.parametrize("finish_reason, ending, status", [
    ("stop", "error", "stop"), ("length", "error", "length"), ("abort", "error", "aborted"),
    (None, "client_disconnect", "client_disconnect"), (None, "error", "error"), ("tool_calls", "error", "finished"),
])
def test_ending_status(finish_reason, ending, status):
    assert ending_status(finish_reason, ending) == status


def test_usage_record_times_are_utc():
    from loraplex.engine.metering import usage_record

    t = datetime(2026, 11, 30, 12, tzinfo=timezone.utc).timestamp()
    rec = usage_record(RequestMeta("r", "t", arrival_time=t),
                       RequestUsage(5, 0, 2, "stop", "rep", t + 0.25, t + 1, "stop"), "base")
    assert rec.arrival_time.tzinfo is not None and rec.finish_time - rec.arrival_time == timedelta(seconds=1)
    assert rec.ttft == pytest.approx(0.25)
