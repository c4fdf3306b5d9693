"""Tenant limits on the OpenAI routes: real tenancy (SQLite), the in-process limiter, a fake engine."""

import asyncio
import json
import threading
import time

import pytest
from starlette.testclient import TestClient

from loraplex.accounting.accounting import Accounting
from loraplex.accounting.rejections import rejection_counts
from loraplex.config import PlatformConfig
from loraplex.db.engine import make_engine
from loraplex.contract import EngineChunk, EngineError
from loraplex.ingress.app import build_ingress_app
from loraplex.ingress.engine_pools import PooledEngineClient
from loraplex.tenancy.tenancy import Tenancy

BASE = "SmolLM2-135M-Instruct"
ADMIN = {"Authorization": "Bearer admin"}


class SlowEngine:
    """One SSE chunk per `step_s`; a stream of `chunks` chunks (prompt 7 tokens)."""

    def __init__(self, chunks=3, step_s=0.0):
        self.chunks, self.step_s = chunks, step_s
        self.calls = 0
        self.gate = threading.Event()
        self.gate.set()

    async def generate(self, call, request):
        self.calls += 1
        if request.messages[0]["content"] == "too long":
            yield EngineError(400, "The prompt is too long.")
            return
        while not self.gate.is_set():  # held open until the test lets it finish
            await asyncio.sleep(0.01)
        for i in range(1, self.chunks + 1):
            if i > 1:
                await asyncio.sleep(self.step_s)
            data = b"data: {}\n\n" if call.stream else json.dumps({"id": call.request_id}).encode()
            yield EngineChunk(data, 7, 0, i)
            if not call.stream:
                return

    async def base_models(self):
        return {"object": "list", "data": [{"id": BASE}]}

    async def ready(self):
        return {"replica_id": "fake", "probe_seconds": 0.0}

    async def replica_status(self):
        return {"replica_id": "fake"}


@pytest.fixture
def app(tmp_path):
    def make(engine=None, plans=None):
        config = PlatformConfig.from_args({
            "engine": {"model": str(tmp_path / BASE)},
            "database_url": f"sqlite:///{tmp_path}/db.sqlite",
            "tenancy": {"plans": plans or {}, "admin_token": "admin"},
        })
        db = make_engine(config.database_url)
        tenancy = Tenancy.from_config(config.tenancy, db)
        accounting = Accounting.start(config.accounting.model_copy(update={"spool_dir": str(tmp_path / "spool")}),
                                      db, "ingress-test")
        engine = engine or SlowEngine()
        client = TestClient(build_ingress_app(engine, config, tenancy=tenancy, accounting=accounting),
                            raise_server_exceptions=False)
        client.accounting, client.service, client.engine = accounting, tenancy.service, engine

        def tenant(name, plan="default", **limits):
            t = tenancy.service.create_tenant(name, plan=plan, limits=limits)
            return t.id, {"Authorization": f"Bearer {tenancy.service.issue_key(t.id)[1]}"}

        client.tenant = tenant
        return client
    return make


def chat(client, headers, stream=False, max_tokens=10, content="hello world!"):
    return client.post("/v1/chat/completions", headers=headers, json={
        "model": BASE, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
        "stream": stream})


def rejections(client):
    client.accounting.ledger.flush()
    from datetime import datetime, timedelta, timezone
    now = datetime.now(timezone.utc)
    return {(r.tenant_id, r.reason): r.count for r in
            rejection_counts(client.accounting.db, now - timedelta(hours=2), now + timedelta(hours=2))}


def test_429_names_the_limit_with_retry_after_and_is_counted_not_billed(app):
    client = app()
    tid, key = client.tenant("acme", requests_per_minute=2)
    assert [chat(client, key).status_code for _ in range(2)] == [200, 200]
    r = chat(client, key)
    assert r.status_code == 429
    assert r.headers["Retry-After"] == "30"
    err = r.json()["error"]
    assert err["code"] == "rate_limit_requests" and err["type"] == "rate_limit_error"
    assert "requests_per_minute" in err["message"]
    assert client.engine.calls == 2  # the refused one never reached the engine
    assert rejections(client) == {(tid, "429:rate_limit_requests"): 1}


def test_tokens_per_minute_charges_max_tokens_and_refunds_what_was_not_generated(app):
    client = app(SlowEngine(chunks=1))
    _, key = client.tenant("acme", tokens_per_minute=300)
    # prompt ~3 + 200 charged; 7 + 1 used: most comes back at once
    assert [chat(client, key, max_tokens=200).status_code for _ in range(5)] == [200] * 5
    r = chat(client, key, max_tokens=400)
    assert r.status_code == 429 and r.json()["error"]["code"] == "rate_limit_tokens"
    assert r.headers["Retry-After"] == "60"  # more than the whole minute's tokens


def test_concurrency_slot_held_while_in_flight_and_released_at_the_end(app):
    client = app()
    _, key = client.tenant("acme", max_concurrent_requests=1)
    client.engine.gate.clear()
    first = []
    thread = threading.Thread(target=lambda: first.append(chat(client, key)))
    thread.start()
    while client.engine.calls < 1:
        time.sleep(0.01)
    r = chat(client, key, stream=True)
    assert r.status_code == 429 and r.headers["Retry-After"] == "1"
    assert r.json()["error"]["code"] == "concurrency_limit"
    client.engine.gate.set()
    thread.join()
    assert first[0].status_code == 200
    assert [chat(client, key, stream=s).status_code for s in (True, False, True)] == [200] * 3


def test_monthly_budget_refuses_until_next_month(app):
    client = app(SlowEngine(chunks=1))
    tid, key = client.tenant("acme", monthly_token_budget=100)
    assert chat(client, key, max_tokens=40).status_code == 200  # 8 used
    r = chat(client, key, max_tokens=95)
    assert r.status_code == 429 and r.json()["error"]["code"] == "budget_exceeded"
    assert int(r.headers["Retry-After"]) >= 1


def test_plan_defaults_apply_and_the_tenant_own_values_win(app):
    client = app(plans={"free": {"limits": {"requests_per_minute": 1, "priority": 7}},
                        "default": {"limits": {"max_concurrent_requests": 5}}})
    _, free = client.tenant("a", plan="free")
    _, own = client.tenant("b", plan="free", requests_per_minute=3)
    _, unknown_plan = client.tenant("c", plan="gold")  # not configured: the default plan's
    assert [chat(client, free).status_code for _ in range(2)] == [200, 429]
    assert [chat(client, own).status_code for _ in range(4)] == [200, 200, 200, 429]
    principal = client.service.authenticate(unknown_plan["Authorization"].split()[1])
    assert principal.limits.max_concurrent_requests == 5
    assert client.service.authenticate(free["Authorization"].split()[1]).limits.priority == 7


def test_limit_patched_by_the_admin_api_takes_effect_at_once(app):
    client = app()
    tid, key = client.tenant("acme")
    assert [chat(client, key).status_code for _ in range(3)] == [200] * 3
    assert client.patch(f"/admin/tenants/{tid}", headers=ADMIN,
                        json={"limits": {"requests_per_minute": 1}}).status_code == 200
    assert [chat(client, key).status_code for _ in range(2)] == [200, 429]
    assert client.patch(f"/admin/tenants/{tid}", headers=ADMIN,
                        json={"limits": {"requests_per_minute": None}}).status_code == 200
    assert chat(client, key).status_code == 200


def test_refusal_before_the_engine_refunds_everything(app):
    client = app()
    _, key = client.tenant("acme", requests_per_minute=1)
    bad = client.post("/v1/chat/completions", headers=key, json={"model": "nope", "messages": []})
    assert bad.status_code == 404  # refused before admission
    assert chat(client, key, content="too long").status_code == 400  # admitted, refused by the engine
    assert chat(client, key).status_code == 200  # ... so the request counted for nothing
    assert chat(client, key).status_code == 429


class RecordingEngine(SlowEngine):
    """SlowEngine that keeps every EngineCall it was handed."""

    def __init__(self):
        super().__init__(chunks=1)
        self.engine_calls = []

    async def generate(self, call, request):
        self.engine_calls.append(call)
        async for item in super().generate(call, request):
            yield item


def test_the_tenants_priority_and_plan_weight_reach_the_engine_call(app):
    """The fair queue's tier and share come from the EngineCall: drop either and this fails."""
    client = app(engine=RecordingEngine(), plans={"gold": {"weight": 3.0, "limits": {"priority": 70}},
                                                  "default": {"weight": 0.5}})
    _, gold = client.tenant("gold-co", plan="gold")
    _, own = client.tenant("own-co", plan="gold", priority=90)
    _, plain = client.tenant("plain-co")
    _, unlisted = client.tenant("odd-co", plan="unlisted")
    for key in (gold, own, plain, unlisted):
        assert chat(client, key).status_code == 200
    got = [(c.priority, c.weight) for c in client.engine.engine_calls]
    # the plan's priority and weight; the tenant's own priority wins; the default plan's weight
    # for a plan with none listed
    assert got == [(70, 3.0), (90, 3.0), (0, 0.5), (0, 0.5)]


TINY = "tiny-llama"


@pytest.fixture
def two_bases(tmp_path):
    """The ingress of two bases (BASE, TINY), each with its own SlowEngine pool, tenancy knowing both."""
    config = PlatformConfig.from_args({
        "models": [{"engine": {"model": str(tmp_path / BASE)}}, {"engine": {"model": str(tmp_path / TINY)}}],
        "database_url": f"sqlite:///{tmp_path}/db.sqlite", "tenancy": {"admin_token": "admin"},
    })
    db = make_engine(config.database_url)
    tenancy = Tenancy.from_config(config.tenancy, db, known_plans=config.plan_names(), known_bases=config.base_names)
    accounting = Accounting.start(config.accounting.model_copy(update={"spool_dir": str(tmp_path / "spool")}),
                                  db, "ingress-test")
    pools = PooledEngineClient({BASE: SlowEngine(), TINY: SlowEngine()})
    client = TestClient(build_ingress_app(pools, config, tenancy=tenancy, accounting=accounting),
                        raise_server_exceptions=False)
    client.accounting, client.service, client.pools = accounting, tenancy.service, pools.pools
    yield client
    accounting.close()


def chat_on(client, headers, model):
    return client.post("/v1/chat/completions", headers=headers, json={
        "model": model, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 10})


def test_a_per_base_limit_refuses_on_its_base_naming_it_while_the_other_base_serves(two_bases):
    client = two_bases
    created = client.post("/admin/tenants", headers=ADMIN, json={
        "name": "acme", "limits": {"requests_per_minute": 5, "models": {TINY: {"requests_per_minute": 1}}}})
    assert created.status_code == 201, created.text
    tid = created.json()["id"]
    assert created.json()["effective_limits"]["models"][TINY]["requests_per_minute"] == 1
    key = {"Authorization": f"Bearer {client.service.issue_key(tid)[1]}"}
    assert [chat_on(client, key, TINY).status_code for _ in range(2)] == [200, 429]
    refused = chat_on(client, key, TINY)
    err = refused.json()["error"]
    assert err["code"] == "rate_limit_requests" and refused.headers["Retry-After"] == "60"
    assert f"on base model {TINY}" in err["message"] and "requests_per_minute is 1" in err["message"]
    # The other base serves, up to the tenant-wide 5 a minute, which counts both bases.
    assert [chat_on(client, key, BASE).status_code for _ in range(5)] == [200, 200, 200, 200, 429]
    assert "on base model" not in chat_on(client, key, BASE).json()["error"]["message"]
    assert (client.pools[TINY].calls, client.pools[BASE].calls) == (1, 4)
    assert rejections(client) == {(tid, "429:rate_limit_requests"): 4}


def test_per_base_limits_are_patched_like_the_others_and_an_unknown_base_is_400(two_bases):
    client = two_bases
    bad = client.post("/admin/tenants", headers=ADMIN, json={
        "name": "acme", "limits": {"models": {"tiny": {"requests_per_minute": 1}}}})
    assert bad.status_code == 400
    assert bad.json()["error"]["message"].startswith(
        f"limits.models: unknown base model 'tiny'; the bases are {BASE}, {TINY}")
    tid = client.post("/admin/tenants", headers=ADMIN, json={"name": "acme"}).json()["id"]
    key = {"Authorization": f"Bearer {client.service.issue_key(tid)[1]}"}
    bad = client.patch(f"/admin/tenants/{tid}", headers=ADMIN, json={"limits": {"models": {"huge": {}}}})
    assert bad.status_code == 400 and f"the bases are {BASE}, {TINY}" in bad.json()["error"]["message"]
    patched = client.patch(f"/admin/tenants/{tid}", headers=ADMIN,
                           json={"limits": {"models": {TINY: {"tokens_per_minute": 1000, "requests_per_minute": 1}}}})
    assert patched.status_code == 200, patched.text
    assert [chat_on(client, key, TINY).status_code for _ in range(2)] == [200, 429]  # at once on this replica
    patched = client.patch(f"/admin/tenants/{tid}", headers=ADMIN,
                           json={"limits": {"models": {TINY: {"requests_per_minute": None}}}})
    assert patched.json()["limits"]["models"][TINY] == {
        "requests_per_minute": None, "tokens_per_minute": 1000, "max_concurrent_requests": None,
        "monthly_token_budget": None}  # the field cleared, the others kept
    last = chat_on(client, key, TINY)
    assert last.status_code == 200, last.text
