"""GenerationBound: the ingress replica's own bound on generation requests in progress."""

import asyncio
import json

from loraplex.ingress.openai_routes import OpenAIRoutes
from loraplex.ingress.overload import REASON, GenerationBound, serve_max_ongoing_requests

PATHS = OpenAIRoutes.GENERATION_PATHS


class HeldApp:
    """An ASGI app whose responses stay open until `release` is set (a stream in progress)."""

    def __init__(self):
        self.release = asyncio.Event()
        self.started = 0

    async def __call__(self, scope, receive, send):
        self.started += 1
        await send({"type": "http.response.start", "status": 200, "headers": []})
        if scope["path"].startswith("/v1/") and scope["path"].endswith("completions"):
            await self.release.wait()
        await send({"type": "http.response.body", "body": b"done"})


async def call(app, path="/v1/chat/completions"):
    """Runs one HTTP request through `app`; returns (status, headers, body)."""
    sent = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": path, "headers": [], "query_string": b""}
    await app(scope, receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], dict(start["headers"]), body


def test_requests_past_the_limit_get_503_with_retry_after_at_once_and_are_counted():
    async def run():
        inner, refusals = HeldApp(), []
        bound = GenerationBound(inner, limit=2, paths=PATHS, on_refused=refusals.append)
        held = [asyncio.create_task(call(bound)) for _ in range(2)]
        await asyncio.sleep(0)
        assert bound.in_flight == 2
        status, headers, body = await asyncio.wait_for(call(bound), 1)  # refused without waiting
        assert status == 503 and headers[b"retry-after"] == b"1"
        error = json.loads(body)["error"]
        assert error["code"] == "ingress_busy" and "overloaded" in error["message"]
        assert refusals == [REASON] and bound.refused == 1 and inner.started == 2
        inner.release.set()
        assert [s for s, _, _ in await asyncio.gather(*held)] == [200, 200]
        assert bound.in_flight == 0
        assert (await call(bound))[0] == 200  # a freed slot admits again

    asyncio.run(run())


def test_only_generation_routes_count_so_health_and_admin_answer_under_overload():
    async def run():
        inner = HeldApp()
        bound = GenerationBound(inner, limit=1, paths=PATHS)
        held = asyncio.create_task(call(bound, "/v1/completions"))
        await asyncio.sleep(0)
        assert bound.in_flight == 1  # at the limit
        for path in ("/readyz", "/admin/tenants", "/v1/models"):
            assert (await asyncio.wait_for(call(bound, path), 1))[0] == 200
        assert (await call(bound, "/v1/chat/completions"))[0] == 503  # both generation routes share it
        inner.release.set()
        await held

    asyncio.run(run())


def test_a_request_that_fails_or_is_cancelled_frees_its_slot():
    async def failing(scope, receive, send):
        raise RuntimeError("client went away")

    async def run():
        bound = GenerationBound(failing, limit=1, paths=PATHS)
        for _ in range(3):
            try:
                await call(bound)
            except RuntimeError:
                pass
        assert bound.in_flight == 0
        inner = HeldApp()
        bound = GenerationBound(inner, limit=1, paths=PATHS)
        task = asyncio.create_task(call(bound))
        await asyncio.sleep(0)
        task.cancel()  # a disconnect cancels the request's task
        await asyncio.gather(task, return_exceptions=True)
        assert bound.in_flight == 0

    asyncio.run(run())


def test_serves_own_bound_sits_far_above_the_apps():
    assert serve_max_ongoing_requests(256) >= 2 * 256


def test_the_ingress_app_enforces_ingress_max_ongoing_requests_and_keeps_serving():
    """The config knob reaches the bound: with `ingress.max_ongoing_requests: 1` and one stream
    held open, the next chat gets 503 + Retry-After, /v1/models still answers, and once the stream
    ends a chat is served again."""
    import httpx
    from fake_engine import FakeEngineClient
    from loraplex.config import PlatformConfig
    from loraplex.ingress.app import build_ingress_app

    model = "SmolLM2-135M-Instruct"
    chat = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": True}

    async def run():
        release = asyncio.Event()

        class HeldEngine(FakeEngineClient):
            async def _stream(self, method, *args):
                await release.wait()
                async for item in super()._stream(method, *args):
                    yield item

        engine = HeldEngine(lambda method, call, request: iter(['data: {"choices":[]}\n\n', "data: [DONE]\n\n"]),
                            calls={"base_models": {"object": "list", "data": [{"id": model}]}})
        app = build_ingress_app(engine, PlatformConfig.from_args({"ingress": {"max_ongoing_requests": 1}}), None)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
            held = asyncio.create_task(client.post("/v1/chat/completions", json=chat))
            for _ in range(100):  # until the held request reaches the engine
                await asyncio.sleep(0.01)
                if engine.requests:
                    break
            refused = await asyncio.wait_for(client.post("/v1/chat/completions", json=chat), 5)
            assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
            assert refused.json()["error"]["code"] == "ingress_busy"
            assert (await client.get("/v1/models")).status_code in (200, 401)  # not refused by the bound
            release.set()
            assert (await held).status_code == 200
            assert (await client.post("/v1/chat/completions", json=chat)).status_code == 200

    asyncio.run(run())
