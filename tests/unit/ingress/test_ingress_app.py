import asyncio
import json

import pytest
from starlette.testclient import TestClient

from fake_engine import FakeEngineClient
from loraplex.config import PlatformConfig
from loraplex.contract import EngineCall, EngineChunk, EngineError
from loraplex.ingress.app import build_ingress_app
from loraplex.ingress.openai_routes import OpenAIRoutes

MODEL = "SmolLM2-135M-Instruct"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
SSE = ['data: {"choices":[{"delta":{"content":"Pa"}}]}\n\n', 'data: {"choices":[{"delta":{"content":"ris"}}]}\n\n', "data: [DONE]\n\n"]
RESPONSE = {"object": "chat.completion", "choices": [{"message": {"content": "Paris"}}], "usage": {"prompt_tokens": 3}}


def script(method, call, request):
    if request.model != MODEL:
        yield EngineError(404, f"The model `{request.model}` does not exist.", "NotFoundError", "model")
        return
    if request.stream:
        yield from SSE
    else:
        yield RESPONSE


@pytest.fixture
def engine():
    return FakeEngineClient(
        script,
        calls={"base_models": {"object": "list", "data": [{"id": MODEL}]}, "ready": {"replica_id": "r1", "probe_seconds": 0.01}},
    )


def make_client(engine, replica_health=None, **ingress):
    config = PlatformConfig.from_args({"ingress": ingress} if ingress else None)
    return TestClient(build_ingress_app(engine, config, replica_health), raise_server_exceptions=False)


def assert_openai_error(response, status):
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == status and error["message"] and error["type"]
    return error


def test_non_stream_returns_engine_response(engine):
    response = make_client(engine).post("/v1/chat/completions", json=CHAT)
    assert response.status_code == 200
    assert response.json() == RESPONSE
    assert engine.finished == 1


def test_stream_passes_sse_through_exactly(engine):
    response = make_client(engine).post("/v1/chat/completions", json={**CHAT, "stream": True})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    assert response.text == "".join(SSE)


def test_completions_route(engine):
    response = make_client(engine).post("/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 2})
    assert response.status_code == 200
    method, call, request = engine.requests[-1]
    assert method == "generate" and isinstance(call, EngineCall) and type(request).__name__ == "CompletionRequest"
    assert call.request_id == request.request_id == response.headers["x-loraplex-request-id"]


def test_engine_refusal_becomes_openai_error_with_its_status(engine):
    error = assert_openai_error(make_client(engine).post("/v1/chat/completions", json={**CHAT, "model": "nope"}), 404)
    assert error["param"] == "model" and error["type"] == "not_found_error"


def test_engine_refusal_on_stream_is_a_plain_error_not_sse(engine):
    response = make_client(engine).post("/v1/chat/completions", json={**CHAT, "model": "nope", "stream": True})
    assert_openai_error(response, 404)


@pytest.mark.parametrize(
    "body, status, needle",
    [
        (b"{not json", 400, "not valid JSON"),
        (b"[1, 2]", 400, "JSON object"),
        (json.dumps({"model": MODEL}).encode(), 400, "messages"),
        (json.dumps({**CHAT, "messages": "hi"}).encode(), 400, "messages"),
        (json.dumps({**CHAT, "temperature": "hot"}).encode(), 400, "temperature"),
        (b"\xff\xfe\x00", 400, "JSON"),
    ],
)
def test_bad_bodies_get_400_and_server_keeps_serving(engine, body, status, needle):
    client = make_client(engine)
    error = assert_openai_error(client.post("/v1/chat/completions", content=body), status)
    assert needle in error["message"]
    assert client.post("/v1/chat/completions", json=CHAT).status_code == 200


def test_oversized_body_gets_413(engine):
    client = make_client(engine, max_request_body_bytes=1000)
    big = {**CHAT, "messages": [{"role": "user", "content": "x" * 5000}]}
    assert_openai_error(client.post("/v1/chat/completions", json=big), 413)
    assert client.post("/v1/chat/completions", json=CHAT).status_code == 200


def test_unknown_route_and_wrong_method_use_openai_error_body(engine):
    client = make_client(engine)
    assert_openai_error(client.get("/v1/nope"), 404)
    assert_openai_error(client.get("/v1/chat/completions"), 405)


def test_engine_lost_before_replying_is_a_503_with_retry_after(engine):
    def broken(method, call, request):
        raise RuntimeError("replica died")
        yield  # pragma: no cover

    client = make_client(FakeEngineClient(broken))
    response = client.post("/v1/chat/completions", json=CHAT)
    assert_openai_error(response, 503)
    assert response.headers["retry-after"]
    assert client.get("/healthz").status_code == 200


def test_engine_lost_mid_stream_ends_with_an_error_event_then_done():
    def dies_after_two(method, call, request):
        yield from SSE[:2]
        raise RuntimeError("ActorDiedError")

    # With migration off (ingress.max_migrations 0); tests/unit/ingress/test_ingress_migration.py has it on.
    response = make_client(FakeEngineClient(dies_after_two), max_migrations=0).post(
        "/v1/chat/completions", json={**CHAT, "stream": True})
    assert response.status_code == 200  # the stream had started
    events = [e for e in response.text.split("\n\n") if e]
    assert events[:2] == [SSE[0].strip(), SSE[1].strip()]
    error = json.loads(events[2].removeprefix("data: "))["error"]
    assert error["code"] == 503 and "lost" in error["message"]
    assert events[3] == "data: [DONE]"


def test_engine_lost_after_a_whole_non_stream_reply_still_returns_it():
    def dies_after_reply(method, call, request):
        yield RESPONSE
        raise RuntimeError("ActorDiedError")

    client = make_client(FakeEngineClient(dies_after_reply))
    response = client.post("/v1/chat/completions", json=CHAT)
    assert response.status_code == 200, response.text
    assert response.json() == RESPONSE
    assert client.post("/v1/chat/completions", json={**CHAT, "stream": True}).status_code == 200


def test_sse_bytes_pass_through_one_message_per_engine_chunk():
    """The ingress does no per-token work: each coalesced EngineChunk is one body message."""
    batch = "".join(SSE[:2]).encode()

    def coalesced(method, call, request):
        yield EngineChunk(batch, 3, 0, 2)
        yield EngineChunk(b"data: [DONE]\n\n", 3, 0, 2)

    async def run():
        routes = OpenAIRoutes(FakeEngineClient(coalesced), 1 << 20)
        call = EngineCall("r1", stream=True)
        items = routes.engine.generate(call, None)
        first = await anext(items)
        return [part async for part in routes._sse(call, first, items)]

    assert asyncio.run(run()) == [batch, b"data: [DONE]\n\n"]


def test_models_lists_engine_models(engine):
    assert make_client(engine).get("/v1/models").json()["data"][0]["id"] == MODEL


def test_readyz_ready_when_probe_generates(engine):
    async def all_healthy():
        return 2, 2, "HEALTHY"

    response = make_client(engine, all_healthy).get("/readyz")
    assert response.status_code == 200 and response.json() == {"status": "ready"}


def test_readyz_503_when_probe_fails():
    engine = FakeEngineClient(script, calls={"ready": RuntimeError("engine dead at 10.0.0.7:6379")})
    response = make_client(engine).get("/readyz")
    assert response.status_code == 503 and response.headers["retry-after"]
    # Public and unauthenticated: the status alone, never the error's text (hosts, ports).
    assert response.json() == {"status": "unready"}


def test_readyz_503_when_a_replica_is_unhealthy(engine):
    async def one_of_two():
        return 1, 2, "UNHEALTHY"

    response = make_client(engine, one_of_two).get("/readyz")
    assert response.status_code == 503 and response.json() == {"status": "degraded"}


def test_readyz_stays_ready_while_the_pool_is_resized(engine):
    """A replica starting (autoscaling up) or stopping (down) is not a failure: a load balancer
    probing /readyz must not take the entry point out on every scaling step."""
    for status in ("UPSCALING", "DOWNSCALING"):
        async def resizing(status=status):
            return 1, 2, status

        response = make_client(engine, resizing).get("/readyz")
        assert response.status_code == 200, (status, response.text)

    async def none_running():
        return 0, 1, "UPSCALING"

    assert make_client(engine, none_running).get("/readyz").status_code == 503


def test_closing_a_stream_early_closes_the_engine_stream(engine):
    """What Starlette does on client disconnect: the SSE generator is closed mid-stream."""

    async def run():
        routes = OpenAIRoutes(engine, 1 << 20)
        call = EngineCall("r1", stream=True)
        items = engine.generate(call, type("R", (), {"model": MODEL, "stream": True})())
        first = await anext(items)
        sse = routes._sse(call, first, items)
        assert await anext(sse) == SSE[0].encode()
        await sse.aclose()

    asyncio.run(run())
    assert engine.closed_early == 1 and engine.finished == 0


def test_a_shed_request_is_a_503_with_the_replicas_retry_after():
    def shed(method, call, request):
        yield EngineError(503, "The server is overloaded (40 requests are queued); retry in a moment.", retry_after=7)

    response = make_client(FakeEngineClient(shed)).post("/v1/chat/completions", json=CHAT)
    assert_openai_error(response, 503)
    assert response.headers["retry-after"] == "7"


def test_a_replica_refusal_with_a_code_of_its_own_reaches_the_client_with_it():
    def spool_full(method, call, request):
        yield EngineError(503, "Usage cannot be recorded on this engine replica: the usage spool /x is full",
                          retry_after=10, reason="usage_spool_full", code="usage_spool_full")

    response = make_client(FakeEngineClient(spool_full)).post("/v1/chat/completions", json=CHAT)
    assert response.status_code == 503
    error = response.json()["error"]
    assert error["code"] == "usage_spool_full" and "/x" in error["message"]
    assert response.headers["retry-after"] == "10"


def test_a_full_engine_queue_is_a_503_refusal_not_an_engine_loss():
    from ray.serve.exceptions import BackPressureError

    def full(method, call, request):
        raise BackPressureError(num_queued_requests=256, max_queued_requests=256)
        yield  # pragma: no cover

    response = make_client(FakeEngineClient(full)).post("/v1/chat/completions", json=CHAT)
    assert "overloaded" in assert_openai_error(response, 503)["message"]
    assert response.headers["retry-after"]


@pytest.mark.parametrize("value", ["abc", "0", "-1", "nan", "inf", "1e999"])
def test_a_bad_timeout_header_is_a_400_naming_it(engine, value):
    response = make_client(engine).post("/v1/chat/completions", json=CHAT, headers={"X-LoRAPlex-Timeout": value})
    assert assert_openai_error(response, 400)["param"] == "X-LoRAPlex-Timeout"


def test_the_deadline_is_the_servers_or_shorter_never_longer(engine):
    client = make_client(engine, request_timeout_s=30)
    for asked, expected in ((None, 30), ("5", 5), ("600", 30)):
        headers = {"X-LoRAPlex-Timeout": asked} if asked else {}
        assert client.post("/v1/chat/completions", json=CHAT, headers=headers).status_code == 200
        call = engine.requests[-1][1]
        assert call.deadline - call.arrival_time == pytest.approx(expected)
