"""The ingress's metrics: refusals under the ledger's own reasons (the two always agree), and the
usage of a request whose Engine replica was lost, from the record the ingress bills. Real tenancy
(SQLite) and ledger, a scripted engine, a fake sink at Ray's edge."""

import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from ray.serve.exceptions import BackPressureError
from sqlalchemy import select
from starlette.testclient import TestClient

from loraplex.accounting.accounting import Accounting
from loraplex.accounting.rejections import rejection_counts
from loraplex.accounting.tables import usage_records
from loraplex.config import PlatformConfig
from loraplex.db.engine import make_engine
from loraplex.contract import EngineChunk, EngineError
from loraplex.ingress.app import build_ingress_app
from loraplex.metrics.recorder import Metrics
from loraplex.metrics import catalog as c
from loraplex.tenancy.tenancy import Tenancy

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "metrics"))
from fake_sink import FakeSink  # noqa: E402

BASE = "SmolLM2-135M-Instruct"


class ScriptedEngine:
    """Answers by the prompt: `ok`, `shed` (the replica sheds: 503 + reason), `full` (Serve's queue
    is full: BackPressureError), `lost` (the replica dies after one chunk)."""

    async def generate(self, call, request):
        what = request.messages[0]["content"]
        if what == "full":
            raise BackPressureError(num_queued_requests=9, max_queued_requests=8)
        if what == "shed":
            yield EngineError(503, "The server is overloaded.", retry_after=2, reason="shed")
            return
        yield EngineChunk(b"data: {}\n\n" if call.stream else b"{}", 11, 3, 4, first_token_time=call.arrival_time + 0.1)
        if what == "lost":
            raise ConnectionError("replica died")

    async def base_models(self):
        return {"object": "list", "data": [{"id": BASE}]}

    async def ready(self):
        return {"replica_id": "fake", "probe_seconds": 0.0}

    async def replica_status(self):
        return {"replica_id": "fake"}


@pytest.fixture
def client(tmp_path):
    config = PlatformConfig.from_args({
        "engine": {"model": str(tmp_path / BASE)},
        "database_url": f"sqlite:///{tmp_path}/db.sqlite",
        "tenancy": {"admin_token": "admin"},
    })
    db = make_engine(config.database_url)
    tenancy = Tenancy.from_config(config.tenancy, db)
    accounting = Accounting.start(config.accounting.model_copy(update={"spool_dir": str(tmp_path / "spool")}),
                                  db, "ingress-test")
    sink = FakeSink()
    metrics = Metrics.for_replica(config.metrics, "ingress", sink)
    app = build_ingress_app(ScriptedEngine(), config, tenancy=tenancy, accounting=accounting, metrics=metrics)
    client = TestClient(app, raise_server_exceptions=False)
    client.sink, client.accounting, client.metrics = sink, accounting, metrics

    def tenant(name, **limits):
        t = tenancy.service.create_tenant(name, limits=limits)
        return t.id, {"Authorization": f"Bearer {tenancy.service.issue_key(t.id)[1]}"}

    client.tenant = tenant
    yield client
    accounting.close()


def chat(client, headers, content="ok", model=BASE, stream=False):
    return client.post("/v1/chat/completions", headers=headers, json={
        "model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 8, "stream": stream})


def ledger_rejections(client) -> dict:
    client.accounting.ledger.flush()
    now = datetime.now(timezone.utc)
    return {(r.tenant_id, r.reason): r.count
            for r in rejection_counts(client.accounting.db, now - timedelta(hours=2), now + timedelta(hours=2))}


def metric_refusals(client) -> dict:
    client.metrics.flush()
    return {(dict(k)[c.TENANT], dict(k)[c.REASON]): v for k, v in client.sink[c.REFUSALS.name].values.items()}


def test_refusals_are_counted_under_the_ledgers_reasons(client):
    tid, key = client.tenant("acme", requests_per_minute=1)
    assert chat(client, {"Authorization": "Bearer nope"}).status_code == 401
    assert chat(client, key, model="no-such-adapter").status_code == 404
    assert chat(client, key, content="shed").status_code == 503
    assert chat(client, key, content="full").status_code == 503
    assert [chat(client, key).status_code for _ in range(2)] == [200, 429]  # engine refusals gave their unit back
    expected = {("-", "401"): 1, (tid, "404"): 1, (tid, "503:shed"): 1, (tid, "503:queue_full"): 1,
                (tid, "429:rate_limit_requests"): 1}
    assert metric_refusals(client) == expected
    assert ledger_rejections(client) == expected
    refusals = client.sink[c.REFUSALS.name]
    assert refusals.total(tenant=tid, adapter=c.BASE, reason="503:shed") == 1  # the call had its model
    assert refusals.total(tenant=tid, adapter=c.UNKNOWN, reason="404") == 1  # refused resolving it
    assert client.sink[c.REQUESTS.name].total() == 0  # a refusal is not a request


def test_a_stream_whose_replica_was_lost_is_counted_from_the_record_the_ingress_bills(client):
    tid, key = client.tenant("acme")
    r = chat(client, key, content="lost", stream=True)
    assert r.status_code == 200 and "replica was lost" in r.text  # the first chunk went out before the loss
    client.accounting.ledger.flush()
    with client.accounting.db.connect() as conn:
        [row] = conn.execute(select(usage_records)).all()
    assert row.status == "engine_error"
    client.metrics.flush()
    sink = client.sink
    assert sink[c.REQUESTS.name].total(tenant=tid, status="error") == 1
    assert sink[c.PROMPT_TOKENS.name].total(tenant=tid) == row.prompt_tokens == 11
    assert sink[c.CACHED_PROMPT_TOKENS.name].total(tenant=tid) == row.cached_prompt_tokens
    assert sink[c.COMPLETION_TOKENS.name].total(tenant=tid) == row.completion_tokens
