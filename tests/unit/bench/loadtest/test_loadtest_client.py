"""One streamed request, timed: TTFT at the first text, tokens from the usage chunk, errors."""
import asyncio
import json

import httpx

from bench.loadtest import workload as wl
from bench.loadtest.client import Target, send
from bench.loadtest.runner import run_closed, run_open

TENANTS = [wl.Tenant("a", "be brief", [0]), wl.Tenant("b", "")]


def sse(*chunks):
    return "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"


def chunk(text=None, role=None):
    delta = {k: v for k, v in (("role", role), ("content", text)) if v is not None}
    return {"choices": [{"index": 0, "delta": delta}]}


USAGE = {"choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": 3,
                                  "prompt_tokens_details": {"cached_tokens": 8}}}


def transport(seen, body=None, status=200):
    def handle(request: httpx.Request):
        seen.append((request.headers.get("authorization"), json.loads(request.content)))
        return httpx.Response(status, text=body if body is not None else sse(chunk("", "assistant"), chunk("Hi"),
                                                                              chunk(" there"), chunk("!"), USAGE),
                              headers={"x-loraplex-request-id": "req-1"})
    return httpx.MockTransport(handle)


def run(coro_fn, t):
    async def go():
        async with httpx.AsyncClient(base_url="http://x", transport=t) as c:
            return await coro_fn(c)
    return asyncio.run(go())


TARGET = Target("loraplex", "http://x", "base", keys=["k-a", "k-b"], adapter_models={0: "style"})


def test_a_stream_is_timed_and_counted_from_its_usage_chunk():
    seen = []
    spec = wl.RequestSpec(0, 0, 0, "hello?", 16)
    r = run(lambda c: send(c, TARGET, spec, TENANTS), transport(seen))
    assert r["status"] == "ok" and r["http_status"] == 200 and r["request_id"] == "req-1"
    assert (r["prompt_tokens"], r["completion_tokens"], r["cached_prompt_tokens"]) == (12, 3, 8)
    assert 0 <= r["ttft"] <= r["e2e"] and r["tpot"] == (r["e2e"] - r["ttft"]) / 2
    assert r["start_epoch"] <= r["first_token_epoch"] <= r["end_epoch"]
    auth, body = seen[0]
    assert auth == "Bearer k-a" and body["model"] == "style" and body["stream"] is True
    assert body["stream_options"] == {"include_usage": True} and body["max_tokens"] == 16
    assert body["messages"] == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello?"}]
    assert "ignore_eos" not in body


def test_base_model_no_system_prompt_and_ignore_eos():
    seen = []
    spec = wl.RequestSpec(0, 1, None, "q", 4, ignore_eos=True)
    run(lambda c: send(c, Target("vllm", "http://x", "base"), spec, TENANTS), transport(seen))
    auth, body = seen[0]
    assert auth is None and body["model"] == "base" and body["ignore_eos"] is True
    assert body["messages"] == [{"role": "user", "content": "q"}]


def test_refusals_and_stream_errors_are_statuses():
    spec = wl.RequestSpec(0, 0, None, "q", 4)
    r = run(lambda c: send(c, TARGET, spec, TENANTS), transport([], body='{"error": {"code": 429}}', status=429))
    assert r["status"] == "http_429" and "429" in r["error"] and r["ttft"] is None
    broken = sse(chunk("Hi"), {"error": {"message": "engine lost", "code": 503}}, {**USAGE})
    r = run(lambda c: send(c, TARGET, spec, TENANTS), transport([], body=broken))
    assert r["status"] == "stream_error_503" and "engine lost" in r["error"]
    r = run(lambda c: send(c, TARGET, spec, TENANTS), transport([], body=sse(chunk("Hi"))))
    assert r["status"] == "no_usage"


def test_closed_and_open_loops_send_every_request(monkeypatch):
    seen = []
    w = wl.Workload(TENANTS, [(0, 0)], [wl.RequestSpec(i, i % 2, None, f"q{i}", 4) for i in range(7)], "t", True)
    real = httpx.AsyncClient

    def mocked(**kw):
        kw["transport"] = transport(seen)
        return real(**kw)

    monkeypatch.setattr(httpx, "AsyncClient", mocked)
    res = asyncio.run(run_closed(TARGET, w, 3, progress=False))
    assert [r["index"] for r in res] == list(range(7)) and all(r["status"] == "ok" for r in res)
    res = asyncio.run(run_open(TARGET, w, 200.0, burstiness=0.5, progress=False))
    assert len(res) == 7 and all(r["status"] == "ok" for r in res)
    assert [r["scheduled_s"] for r in res] == sorted(r["scheduled_s"] for r in res)
    assert len(seen) == 14
