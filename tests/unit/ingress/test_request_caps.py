"""What a request runs, counted at the ingress (issue 34): sequences = n x prompts on the
EngineCall, the per-request caps (400 naming the cap), admission by sequences with vLLM's real
default max_tokens, and bodies read under a deadline after the tenant's slot is taken."""

import asyncio
import json

import httpx
import pytest
from starlette.testclient import TestClient

from loraplex.config import PlatformConfig
from loraplex.contract import EngineChunk
from loraplex.db.engine import make_engine
from loraplex.ingress.app import build_ingress_app
from loraplex.ingress.request_size import request_size
from loraplex.tenancy.tenancy import Tenancy
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.entrypoints.openai.completion.protocol import CompletionRequest

BASE = "SmolLM2-135M-Instruct"


class RecordingEngine:
    """Replies at once; keeps every (call, request) it was given."""

    def __init__(self):
        self.calls = []

    async def generate(self, call, request):
        self.calls.append((call, request))
        yield EngineChunk(json.dumps({"id": call.request_id}).encode(), 7, 0, 1, final=True)

    async def base_models(self):
        return {"object": "list", "data": [{"id": BASE}]}

    async def ready(self):
        return {"replica_id": "fake", "probe_seconds": 0.0}

    async def replica_status(self):
        return {"replica_id": "fake"}


def build(tmp_path, **ingress):
    config = PlatformConfig.from_args({
        "engine": {"model": str(tmp_path / BASE), "max_model_len": 2048},
        "database_url": f"sqlite:///{tmp_path}/db.sqlite",
        "tenancy": {"admin_token": "admin"},
        "ingress": ingress,
    })
    tenancy = Tenancy.from_config(config.tenancy, make_engine(config.database_url))
    engine = RecordingEngine()
    app = build_ingress_app(engine, config, tenancy=tenancy)

    def tenant(name, **limits):
        t = tenancy.service.create_tenant(name, limits=limits)
        return {"Authorization": f"Bearer {tenancy.service.issue_key(t.id)[1]}"}
    return app, engine, tenant


@pytest.fixture
def platform(tmp_path):
    app, engine, tenant = build(tmp_path)
    client = TestClient(app, raise_server_exceptions=False)
    client.engine, client.tenant = engine, tenant
    return client


def chat_body(**kw):
    return {"model": BASE, "messages": [{"role": "user", "content": "hello world!"}], "max_tokens": 10, **kw}


def completion_body(prompt, **kw):
    return {"model": BASE, "prompt": prompt, "max_tokens": 10, **kw}


@pytest.mark.parametrize("model, body, sequences", [
    (ChatCompletionRequest, chat_body(), 1),
    (ChatCompletionRequest, chat_body(n=5), 5),
    (CompletionRequest, completion_body("one"), 1),
    (CompletionRequest, completion_body([1, 2, 3]), 1),  # token ids: one prompt
    (CompletionRequest, completion_body(["a", "b", "c"], n=2), 6),
    (CompletionRequest, completion_body([[1, 2], [3], [4, 5]]), 3),
])
def test_sequences_are_n_times_prompts(model, body, sequences):
    assert request_size(model.model_validate(body)).sequences == sequences


def test_the_engine_call_carries_the_requests_sequences(platform):
    key = platform.tenant("acme")
    assert platform.post("/v1/completions", headers=key, json=completion_body(["a", "b"], n=3)).status_code == 200
    call, _ = platform.engine.calls[-1]
    assert call.sequences == 6


@pytest.mark.parametrize("limits, path, body, cap, param", [
    ({"max_n": 4}, "/v1/chat/completions", chat_body(n=24), "max_n", "n"),
    ({"max_prompts_per_request": 8}, "/v1/completions", completion_body(["p"] * 200), "max_prompts_per_request",
     "prompt"),
    ({"max_tokens_per_request": 100}, "/v1/chat/completions", chat_body(max_tokens=101), "max_tokens_per_request",
     "max_tokens"),
    ({"max_sequences_per_request": 6}, "/v1/completions", completion_body(["a", "b", "c", "d"], n=2),
     "max_sequences_per_request", "prompt"),
    # more sequences than the tenant may ever run at once: refused, never queued
    ({"max_concurrent_requests": 4}, "/v1/chat/completions", chat_body(n=5), "max_concurrent_requests", "n"),
])
def test_a_request_over_a_cap_is_400_naming_the_cap_and_its_value(platform, limits, path, body, cap, param):
    key = platform.tenant("acme", **limits)
    r = platform.post(path, headers=key, json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    value = next(iter(limits.values()))
    assert err["code"] == cap and err["param"] == param and f"{cap} ({value})" in err["message"], err
    assert platform.engine.calls == []  # refused before the engine


@pytest.mark.parametrize("path, body, param, asked", [
    ("/v1/chat/completions", chat_body(n=16000), "n", "n = 16000"),
    ("/v1/chat/completions", chat_body(n=100000), "n", "n = 100000"),  # vLLM's own check is at 16384
    ("/v1/completions", completion_body(["p"] * 1000), "prompt", "n x prompts): 1000"),
    ("/v1/completions", completion_body(["p"] * 2000), "prompt", "n x prompts): 2000"),  # vLLM's parser: 1024
    ("/v1/completions", completion_body(["a", "b", "c"], n=11), "prompt", "n x prompts): 33"),
])
def test_a_request_over_the_servers_bound_is_400_whatever_the_plan(platform, path, body, param, asked):
    # engine.max_num_seqs is 32 (the default): no request carries more sequences than one batch,
    # for a tenant with no caps of its own or its plan's, and never with vLLM's server-side advice.
    key = platform.tenant("acme")
    r = platform.post(path, headers=key, json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "max_sequences_per_request" and err["param"] == param, err
    assert asked in err["message"] and "bound of 32 sequences per request" in err["message"], err
    assert "VLLM_" not in err["message"] and "environment variable" not in err["message"]
    assert platform.engine.calls == []
    assert platform.post("/v1/chat/completions", headers=key, json=chat_body(n=32)).status_code == 200  # the bound runs


def test_the_bound_is_each_base_models_own(tmp_path):
    # Two pools: a request on the base whose replicas batch 8 is bounded at 8, the other's at 32.
    from loraplex.ingress.openai_routes import OpenAIRoutes
    from loraplex.ingress.request_size import RequestSize, server_bound
    assert server_bound(32) == 32 and server_bound(4096) == 1024  # vLLM's parser takes 1024 prompts
    routes = OpenAIRoutes(RecordingEngine(), 1 << 20, max_sequences={"big": 32, "small": 8})
    routes._check_size(None, RequestSize(choices=32, prompts=1, max_tokens=None))  # the largest pool's
    with pytest.raises(Exception, match="bound of 32"):
        routes._check_size(None, RequestSize(choices=33, prompts=1, max_tokens=None))


def test_a_chat_request_without_max_tokens_runs_with_the_cap(platform):
    key = platform.tenant("acme", max_tokens_per_request=64)
    body = chat_body()
    del body["max_tokens"]
    assert platform.post("/v1/chat/completions", headers=key, json=body).status_code == 200
    call, request = platform.engine.calls[-1]
    assert request.max_completion_tokens == 64 and call.max_tokens == 64


def test_a_chat_request_without_max_tokens_is_charged_the_rest_of_the_context(platform):
    # vLLM lets it generate max_model_len - prompt (2048 - 3), not the 512 once assumed.
    key = platform.tenant("acme", tokens_per_minute=1500)
    body = chat_body()
    del body["max_tokens"]
    r = platform.post("/v1/chat/completions", headers=key, json=body)
    assert r.status_code == 429 and r.json()["error"]["code"] == "rate_limit_tokens", r.text
    assert "2048 tokens" in r.json()["error"]["message"]  # 3 + 2045
    assert platform.post("/v1/chat/completions", headers=key, json=chat_body(max_tokens=1000)).status_code == 200


def test_n_choices_are_charged_each_their_max_tokens(platform):
    key = platform.tenant("acme", tokens_per_minute=1000)
    r = platform.post("/v1/chat/completions", headers=key, json=chat_body(n=4, max_tokens=300))
    assert r.status_code == 429 and "1203 tokens" in r.json()["error"]["message"], r.text


# -- the body deadline, and the tenant's slot taken before it ---------------------------------------
async def slow_body(first: bytes, stall_s: float):
    yield first
    await asyncio.sleep(stall_s)
    yield b"}"


def test_a_body_that_does_not_arrive_in_time_is_408(tmp_path):
    app, engine, tenant = build(tmp_path, body_timeout_s=0.3)
    key = tenant("acme")

    async def go():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return await client.post("/v1/chat/completions", headers={**key, "Content-Length": "100000"},
                                     content=slow_body(b'{"model": ', 30))
    r = asyncio.run(asyncio.wait_for(go(), 10))
    assert r.status_code == 408, r.text
    err = r.json()["error"]
    assert err["type"] == "timeout_error" and "ingress.body_timeout_s" in err["message"]
    assert engine.calls == []


def test_slow_bodies_hold_their_own_tenants_slots_not_the_ingress(tmp_path):
    # The ingress takes 4 generation requests at once; the attacker may hold 2. Its slow bodies
    # take its own 2 slots; its other connections are refused before their body is read, and the
    # ingress keeps room for the bystander.
    app, engine, tenant = build(tmp_path, body_timeout_s=1.0, max_ongoing_requests=4)
    attacker, bystander = tenant("attacker", max_concurrent_requests=2), tenant("bystander")

    async def go():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test", timeout=30) as client:
            slow = [asyncio.create_task(client.post(
                "/v1/chat/completions", headers={**attacker, "Content-Length": "100000"},
                content=slow_body(b'{"model": ', 30))) for _ in range(4)]
            early = []  # the first two to end: refused at once, before the others' bodies time out
            for first in asyncio.as_completed(slow):
                early.append((await first).status_code)
                if len(early) == 2:
                    break
            served = (await client.post("/v1/chat/completions", headers=bystander, json=chat_body())).status_code
            return early, served, [(await t).status_code for t in slow]
    early, served, attacker_got = asyncio.run(asyncio.wait_for(go(), 20))
    assert early == [429, 429]  # at once, before their bodies
    assert served == 200
    assert sorted(attacker_got) == [408, 408, 429, 429]


def test_a_client_gone_mid_body_is_a_counted_refusal_not_an_internal_error():
    from starlette.requests import Request

    from loraplex.errors import StatusError
    from loraplex.ingress.openai_routes import BODY_INCOMPLETE_REASON, read_body

    messages = iter([{"type": "http.request", "body": b'{"mo', "more_body": True}, {"type": "http.disconnect"}])

    async def receive():
        return next(messages)
    request = Request({"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": []}, receive)
    with pytest.raises(StatusError) as e:
        asyncio.run(read_body(request, 1 << 20, 5.0))
    assert e.value.status == 400 and e.value.refusal_reason == BODY_INCOMPLETE_REASON


def test_a_tenant_without_a_concurrency_limit_reads_a_bounded_number_of_bodies_at_once(tmp_path):
    app, engine, tenant = build(tmp_path, body_timeout_s=1.0, max_ongoing_requests=4, max_body_reads_per_tenant=2)
    attacker, bystander = tenant("attacker"), tenant("bystander")  # no limits

    async def go():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test", timeout=30) as client:
            slow = [asyncio.create_task(client.post(
                "/v1/chat/completions", headers={**attacker, "Content-Length": "100000"},
                content=slow_body(b'{"model": ', 30))) for _ in range(4)]
            await asyncio.sleep(0.2)
            early = [t.result() for t in slow if t.done()]
            served = (await client.post("/v1/chat/completions", headers=bystander, json=chat_body())).status_code
            return early, served, [(await t).status_code for t in slow]
    early, served, attacker_got = asyncio.run(asyncio.wait_for(go(), 20))
    assert [r.status_code for r in early] == [429, 429]
    assert early[0].json()["error"]["code"] == "body_reads" and early[0].headers["Retry-After"] == "1"
    assert served == 200
    assert sorted(attacker_got) == [408, 408, 429, 429]
