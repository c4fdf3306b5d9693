#!/usr/bin/env python
"""Streaming through the platform at GPU token rates: tokens/s delivered, added TTFT and TPOT.

    python scripts/bench_stream.py [--modes paced,instant] [--streams 64,128,256,512]
                                   [--variants direct,bare,before,after] [--after '{"stream_window_s": 0.1}']

The real ingress, router and Engine deployment behind Serve's HTTP proxy on 127.0.0.1, with the
engine class swapped for `BenchmarkFakeEngine`, which emits tokens itself and loads no model:
- paced: a token every `--interval` (20 ms: a loaded GPU's decode step; a replica's streams all
  step together; the first token comes at once). Offered load = streams / interval.
  Closed loop: `streams` requests always run, each client sending its next request when one
  ends; measured are the requests sent once all run (see run_streams).
- instant: every token at once (one per stream per event-loop turn), all streams sent at once:
  the ceiling.

Variants, one after another in the same run:
- direct: the same fake behind a bare asyncio HTTP server, no Ray: what the client and kernel
  add, and the client's own ceiling.
- bare: Ray Serve alone, one item per token on both hops: a minimal HTTP deployment streaming
  one body message per item from a minimal deployment around the fake. In instant mode the
  handle hop alone (deployment to deployment, no HTTP) is measured as well.
- before: the platform with `stream_window_s: 0` (one Ray stream item per chunk).
- after: the platform with its default coalescing (or `--after`'s engine_deployment fields).

The client is raw asyncio on one HTTP/1.1 connection per request, in this process, sharing the
cores. It counts `data: {` events in the bytes (in the fake one event is one token), never
parses them. Per request: TTFT = first token - request sent, TPOT = (last token - first token)
/ (tokens - 1); added TTFT = TTFT (the fake's first token is immediate), added TPOT = TPOT -
interval. Gap = time between two reads that carried tokens. Delivered tokens/s: paced, streams x
the mean of (tokens - 1) / (last - first), i.e. how fast streams flow against the engine's
pace (TTFT apart); instant, all tokens / (last token - first request).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, AsyncIterator

ADMIN = "bench-stream-admin-token"
APP = "benchstream"
TOKEN_EVENT_KEY = b"data: {"  # one per token in the fake's stream
DONE = b"data: [DONE]"


# -- the benchmark fake engine ------------------------------------------------------------------
class _StepClock:
    """One decode step for every stream of a replica, like a GPU batch: a shared tick every
    `interval`. A late tick catches up (streams then emit every token that was due), so the
    offered load stays streams / interval whatever the event loop's lag."""

    def __init__(self, interval: float):
        self.interval = interval
        self.t0 = 0.0
        self.tick = 0
        self._next: asyncio.Future | None = None
        self._task: asyncio.Task | None = None

    def now(self) -> int:
        """The current step; the clock starts with the first stream."""
        if self._task is None:
            self.t0 = time.monotonic()
            self._task = asyncio.get_running_loop().create_task(self._run())
        return self.tick

    async def wait(self) -> None:
        self.now()
        if self._next is None:
            self._next = asyncio.get_running_loop().create_future()
        await asyncio.shield(self._next)

    async def _run(self) -> None:
        while True:
            due = self.t0 + (self.tick + 1) * self.interval
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            # Timers may fire a hair early: a tick always moves on.
            self.tick = max(self.tick + 1, int((time.monotonic() - self.t0) / self.interval))
            waiting, self._next = self._next, None
            if waiting is not None:
                waiting.set_result(None)


class _NoAdapters:
    targets: dict = {}

    def loaded_ids(self) -> list:
        return []

    async def retire(self, ids) -> None:
        pass


class BenchmarkFakeEngine:
    """The engine interface the Engine deployment calls, emitting tokens itself (no model, no
    vLLM). `config.engine_kwargs["benchmark_token_interval_s"]`: seconds per token (0: instant)."""

    def __init__(self, config, replica_id: str = "", adapter_store=None, metrics=None):
        self.model = config.model_id
        self.replica_id = replica_id
        interval = float(config.engine_kwargs.get("benchmark_token_interval_s", 0.02))
        self.clock = _StepClock(interval) if interval > 0 else None
        self.adapters = _NoAdapters()
        self.probes_done = 0
        self._last = time.time()
        self._running = 0

    async def start(self) -> None:
        pass

    async def shutdown(self) -> None:
        pass

    async def generate(self, call, request, usage) -> AsyncIterator[Any]:
        n = getattr(request, "max_completion_tokens", None) or request.max_tokens or 16
        usage.prompt_tokens = 8
        usage.engine_request_ids.append(request.request_id)
        self._running += 1
        try:
            if not request.stream:
                async for _ in self._tokens(n, usage):
                    pass
                yield {"id": f"chatcmpl-{request.request_id}", "object": "chat.completion",
                       "created": int(time.time()), "model": request.model,
                       "choices": [{"index": 0, "message": {"role": "assistant", "content": " tok" * n},
                                    "finish_reason": "length"}],
                       "usage": {"prompt_tokens": usage.prompt_tokens, "completion_tokens": n,
                                 "total_tokens": usage.prompt_tokens + n}}
                return
            # vLLM's chunk shape, serialized once per request: per token only the tail differs.
            head = ('data: {"id":"chatcmpl-%s","object":"chat.completion.chunk","created":%d,"model":%s,'
                    '"choices":[{"index":0,"delta":{"content":" tok"},"logprobs":null,"finish_reason":'
                    % (request.request_id, int(time.time()), json.dumps(request.model)))
            middle, last = head + "null}]}\n\n", head + '"length"}]}\n\n'
            async for i in self._tokens(n, usage):
                yield last if i == n - 1 else middle
            yield "data: [DONE]\n\n"
        finally:
            self._running -= 1
            if usage.finish_time is None:  # cancelled: the client went away
                usage.status, usage.finish_time = "client_disconnect", time.time()

    async def _tokens(self, n: int, usage) -> AsyncIterator[int]:
        """Token indexes 0..n-1 at the engine's pace, metering each as the contract says."""
        start = self.clock.now() if self.clock else 0
        i = 0
        while i < n:
            due = n if self.clock is None else min(n, self.clock.tick - start + 1)
            while i < due:
                usage.completion_tokens += 1
                if i == 0:
                    usage.first_token_time = time.time()
                yield i
                i += 1
                if self.clock is None:
                    await asyncio.sleep(0)  # one token per stream per loop turn: a batch, not a hog
            self._last = time.time()
            if i < n and self.clock is not None:
                await self.clock.wait()
        usage.finish_reason = usage.status = "length"
        usage.finish_time = time.time()

    async def probe(self) -> float:
        self.probes_done += 1
        self._last = time.time()
        return 0.0

    def last_progress(self) -> float:
        return self._last

    def num_unfinished_requests(self) -> int:
        return self._running

    async def list_models(self) -> dict:
        return {"object": "list", "data": [{"id": self.model, "object": "model", "owned_by": "loraplex",
                                            "root": self.model, "parent": None}]}


# -- Ray Serve alone, one item per token ---------------------------------------------------------
def bare_app(interval: float, model: str):
    """HTTP proxy -> BareIngress -> BareTokens over a streaming handle, one item and one body
    message per token: the platform's two hops without the platform."""
    from types import SimpleNamespace

    from ray import serve
    from starlette.responses import StreamingResponse

    from loraplex.config import EngineConfig

    @serve.deployment(max_ongoing_requests=4096)
    class BareTokens:
        def __init__(self):
            config = EngineConfig(model=model, engine_kwargs={"benchmark_token_interval_s": interval})
            self.engine = BenchmarkFakeEngine(config)

        async def stream(self, n: int, request_id: str = "bare"):
            request = SimpleNamespace(stream=True, max_tokens=n, model=model, request_id=request_id)
            usage = SimpleNamespace(engine_request_ids=[], completion_tokens=0, finish_time=None)
            async for event in self.engine.generate(None, request, usage):
                yield event

        def num_unfinished_requests(self) -> int:
            return self.engine.num_unfinished_requests()

    @serve.deployment(max_ongoing_requests=4096)
    class BareIngress:
        def __init__(self, tokens):
            self.tokens = tokens

        async def __call__(self, request):
            body = json.loads(await request.body())
            items = self.tokens.options(stream=True).stream.remote(body["max_tokens"])
            return StreamingResponse(items, media_type="text/event-stream")

        async def handle_hop(self, streams: int, tokens: int, duration: float) -> dict:
            """Deployment-to-deployment items/s, no HTTP: `streams` handle streams of `tokens` items."""
            received = 0

            async def one():
                nonlocal received
                async for _ in self.tokens.options(stream=True).stream.remote(tokens):
                    received += 1

            t0 = time.perf_counter()
            tasks = [asyncio.ensure_future(one()) for _ in range(streams)]
            done, pending = await asyncio.wait(tasks, timeout=duration)
            elapsed = time.perf_counter() - t0
            for t in pending:
                t.cancel()
            return {"items": received, "seconds": elapsed}

    return BareIngress.bind(BareTokens.bind())


# -- no Ray at all: the client's own floor -------------------------------------------------------
def direct_server(port: int, interval: float, model: str) -> None:
    """The same fake behind a bare asyncio HTTP/1.1 server, one write per token, in its own
    process: what the client and the kernel add, and the client's own ceiling."""
    from types import SimpleNamespace

    from loraplex.config import EngineConfig

    engine = BenchmarkFakeEngine(EngineConfig(model=model, engine_kwargs={"benchmark_token_interval_s": interval}))

    async def handle(reader, writer):
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            body = json.loads(await reader.readexactly(length))
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                         b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n")
            request = SimpleNamespace(stream=True, max_tokens=body["max_tokens"], model=model, request_id="direct")
            usage = SimpleNamespace(engine_request_ids=[], completion_tokens=0, finish_time=None)
            async for event in engine.generate(None, request, usage):
                data = event.encode()
                writer.write(b"%x\r\n%s\r\n" % (len(data), data))
            writer.write(b"0\r\n\r\n")
            await writer.drain()
        except (ConnectionError, RuntimeError, asyncio.IncompleteReadError):  # the client cut it
            pass
        finally:
            writer.close()

    async def serve_forever():
        server = await asyncio.start_server(handle, "127.0.0.1", port, backlog=4096)
        async with server:
            await server.serve_forever()

    arun(serve_forever())


# -- the client ---------------------------------------------------------------------------------
class _SSEStream(asyncio.Protocol):
    """One streamed request on its own connection; counts token events as bytes arrive."""

    def __init__(self, request: bytes, done: asyncio.Future):
        self.request, self.done = request, done
        self.gaps: list[float] = []  # seconds between reads that carried tokens
        self.sent = self.first = self.last = None
        self.tokens, self.status, self.tail, self.finished, self.cut = 0, None, b"", False, False
        self.transport = None

    def connection_made(self, transport):
        self.transport = transport
        self.sent = time.perf_counter()
        transport.write(self.request)

    def data_received(self, data: bytes):
        now = time.perf_counter()
        if self.status is None:
            self.status = int(data[9:12])
            if self.status != 200:
                self.transport.close()
                return
        buf = self.tail + data
        # The tail is shorter than the token marker, so no event is counted twice.
        n = buf.count(TOKEN_EVENT_KEY)
        if n:
            if self.first is None:
                self.first = now
            else:
                self.gaps.append(now - self.last)
            self.last = now
            self.tokens += n
        if DONE in buf:
            self.finished = True
        self.tail = buf[-(len(TOKEN_EVENT_KEY) - 1):]

    def connection_lost(self, exc):
        if not self.done.done():
            self.done.set_result(None)


async def run_streams(port: int, api_key: str | None, model: str, streams: int, tokens: int, duration: float,
                      lifetime: float = 0.0) -> dict:
    """`streams` concurrent streamed chat requests of `tokens` tokens; all cut after `duration` s.

    lifetime 0: one request per stream, all sent at once. Else a closed loop: each of `streams`
    workers sends requests back to back until the cut, the first ones spread over `lifetime`
    (one request's length), so that `streams` always run and arrive at a steady
    streams / lifetime per second. Measured: the requests sent after that ramp, when all
    `streams` run (all requests, if the platform is too slow for any to be sent then)."""
    loop = asyncio.get_running_loop()
    body = json.dumps({"model": model, "stream": True, "max_tokens": tokens,
                       "messages": [{"role": "user", "content": "Stream, please."}]}).encode()
    auth = f"Authorization: Bearer {api_key}\r\n" if api_key else ""
    request = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{auth}"
               f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
               ).encode() + body
    protos: list[_SSEStream] = []
    t0 = time.perf_counter()
    deadline = t0 + duration

    async def one() -> _SSEStream:
        proto = _SSEStream(request, loop.create_future())
        protos.append(proto)
        try:
            await loop.create_connection(lambda: proto, "127.0.0.1", port)
            await asyncio.wait_for(proto.done, max(0.0, deadline - time.perf_counter()))
        except asyncio.TimeoutError:
            proto.cut = True
        except OSError:
            pass
        finally:
            if proto.transport is not None:
                proto.transport.close()  # cut at the deadline: the platform must abort it
        return proto

    async def worker(i: int):
        await asyncio.sleep(lifetime * i / streams)
        while True:
            proto = await one()
            if not lifetime or time.perf_counter() >= deadline:
                return
            if proto.status != 200 and proto.first is None:
                await asyncio.sleep(0.1)  # refused or failed: do not spin

    await asyncio.gather(*(worker(i) for i in range(streams)))
    protos = [p for p in protos if p.sent and p.sent >= t0 + lifetime] or protos
    ok = [p for p in protos if p.first is not None]
    multi = [p for p in ok if p.tokens > 1]
    total = sum(p.tokens for p in protos)
    rates = [(p.tokens - 1) / (p.last - p.first) for p in multi if p.last > p.first]
    return {
        "streams": streams,
        "requests": len(protos),
        "tokens": total,
        # Ended short of its tokens and [DONE], other than by the client's cut at the deadline.
        "failed": sum(not p.cut and not (p.finished and p.tokens == tokens) for p in protos),
        "errors": sorted({p.status for p in protos if p.status not in (None, 200)}),
        "wall_tok_s": total / (max(p.last for p in ok) - t0) if ok else 0.0,
        "flow_tok_s": statistics.mean(rates) * streams if rates else 0.0,  # streams at the mean rate
        "ttft": [p.first - p.sent for p in ok],
        "tpot": [(p.last - p.first) / (p.tokens - 1) for p in multi],
        "gaps": [g for p in protos for g in p.gaps],
    }


# -- deployments --------------------------------------------------------------------------------
def arun(coro):
    """Run the client on uvloop when there is one: it shares the cores with the platform."""
    try:
        import uvloop
        factory = uvloop.new_event_loop
    except ImportError:
        factory = None
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(coro)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stub_model_dir(state: Path, name: str) -> Path:
    """A config.json of the served model's shape and no weights: the ingress validates adapter
    uploads against it at start-up; the fake engine reads nothing."""
    d = state / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps({
        "model_type": "llama", "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
        "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64, "vocab_size": 49152}))
    return d


def platform_args(state: Path, model_dir: Path, interval: float, streaming: dict, max_streams: int) -> dict:
    engine_deployment: dict[str, Any] = {
        # A GPU replica with a large batch takes every stream; Serve must not queue them.
        "max_ongoing_requests": max_streams + 64,
        "health_check_period_s": 30,
        # A GPU replica holds every stream in its batch: this measures streaming, not shedding
        # (the fake's streams never wait, so in-flight requests are not a queue here).
        "shedding": {"enabled": False},
        **streaming,
    }
    return {
        "database_url": f"sqlite:///{state}/loraplex.db",
        "registry": {"store_url": str(state / "adapters"), "cache_dir": str(state / "cache")},
        "tenancy": {"admin_token": ADMIN},
        "accounting": {"spool_dir": str(state / "spool")},
        "engine": {"model": str(model_dir), "engine_kwargs": {"benchmark_token_interval_s": interval}},
        "engine_deployment": engine_deployment,
        "ingress": {"max_ongoing_requests": max_streams + 64},
    }


def deploy_platform(args: dict):
    from ray import serve

    from loraplex.config import PlatformConfig
    from loraplex.engine.deployment import engine_deployment
    from loraplex.ingress.deployment import ingress_deployment

    # build_app's binding, with the fake engine class as the Engine's second init argument.
    cfg = PlatformConfig.from_args(args)
    engine = engine_deployment(cfg.engine_deployment).bind(cfg, BenchmarkFakeEngine)
    serve.run(ingress_deployment(cfg.ingress).bind(engine, cfg), name=APP, route_prefix="/", blocking=False)


def wait_http(base_url: str, path: str, timeout_s: float = 300) -> None:
    import httpx

    deadline = time.time() + timeout_s
    while time.time() < deadline:
        try:
            if httpx.get(base_url + path, timeout=10).status_code in (200, 405):
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{base_url}{path} not ready after {timeout_s} s")


def tenant_key(base_url: str) -> str:
    import httpx

    admin = {"Authorization": f"Bearer {ADMIN}"}
    tenant = httpx.post(f"{base_url}/admin/tenants", json={"name": "bench"}, headers=admin, timeout=30)
    tenant.raise_for_status()
    key = httpx.post(f"{base_url}/admin/tenants/{tenant.json()['id']}/keys", headers=admin, timeout=30)
    key.raise_for_status()
    return key.json()["key"]


def settle(deployment: str, timeout_s: float = 30) -> None:
    """Wait until the token source has no request left (cut streams must have been aborted)."""
    from ray import serve

    handle = serve.get_deployment_handle(deployment, app_name=APP)
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        try:
            if handle.num_unfinished_requests.remote().result(timeout_s=10) == 0:
                return
        except Exception:
            return
        time.sleep(0.2)
    print(f"  ! {deployment} still has unfinished requests after {timeout_s} s", flush=True)


# -- report -------------------------------------------------------------------------------------
def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def summarize(mode: str, variant: str, r: dict, interval: float) -> dict:
    paced = mode == "paced"
    delivered = r["flow_tok_s"] if paced else r["wall_tok_s"]
    offered = r["streams"] / interval if paced else None
    tpot_add = interval if paced else 0.0
    return {
        "mode": mode, "streams": r["streams"], "variant": variant, "offered": offered, "delivered": delivered,
        "ttft_p50": pct(r["ttft"], 0.5) * 1e3, "ttft_p99": pct(r["ttft"], 0.99) * 1e3,
        "tpot_p50": (pct(r["tpot"], 0.5) - tpot_add) * 1e3, "tpot_p99": (pct(r["tpot"], 0.99) - tpot_add) * 1e3,
        "gap_p99": pct(r["gaps"], 0.99) * 1e3, "failed": r["failed"], "requests": r["requests"], "errors": r["errors"],
        "tokens": r["tokens"],
    }


def print_table(rows: list[dict], hop: list[dict]) -> None:
    print()
    print("| mode | streams | variant | offered tok/s | delivered tok/s | delivered/offered | TTFT p50 ms "
          "| TTFT p99 ms | added TPOT p50 ms | added TPOT p99 ms | gap p99 ms | requests (failed) | load avg |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        offered = f"{r['offered']:,.0f}" if r["offered"] else "-"
        share = f"{r['delivered'] / r['offered']:.1%}" if r["offered"] else "-"
        errors = f" (HTTP {r['errors']})" if r["errors"] else ""
        print(f"| {r['mode']} | {r['streams']} | {r['variant']} | {offered} | {r['delivered']:,.0f} | {share} "
              f"| {r['ttft_p50']:.1f} | {r['ttft_p99']:.1f} | {r['tpot_p50']:.2f} | {r['tpot_p99']:.2f} "
              f"| {r['gap_p99']:.1f} | {r['requests']} ({r['failed']}){errors} | {r['load']:.1f} |")
    by = {(r["mode"], r["streams"], r["variant"]): r for r in rows}
    ratios = []
    for (mode, streams, variant), r in by.items():
        if variant != "after":
            continue
        parts = [f"{mode} {streams}:"]
        for base in ("before", "bare"):
            b = by.get((mode, streams, base))
            if b and b["delivered"]:
                parts.append(f"after/{base} {r['delivered'] / b['delivered']:.2f}x tok/s, "
                             f"TTFT p50 {r['ttft_p50'] - b['ttft_p50']:+.1f} ms")
        if len(parts) > 1:
            ratios.append(" ".join(parts))
    if ratios:
        print("\n" + "\n".join(ratios))
    if hop:
        print("\nRay Serve handle hop alone (deployment to deployment, one item per token, no HTTP):")
        for h in hop:
            print(f"  {h['streams']} streams: {h['items'] / h['seconds']:,.0f} items/s")


def print_targets(rows: list[dict], window_s: float) -> None:
    by = {(r["mode"], r["streams"], r["variant"]): r for r in rows}
    print("\nTargets (issue 9):")
    paced = by.get(("paced", 128, "after"))
    if paced:
        share = paced["delivered"] / paced["offered"]
        print(f"  paced 128: delivered {share:.1%} of offered (>= 99%): {'MET' if share >= 0.99 else 'NOT MET'}; "
              f"added TPOT p99 {paced['tpot_p99']:.2f} ms (<= window {window_s * 1e3:.0f} ms): "
              f"{'MET' if paced['tpot_p99'] <= window_s * 1e3 else 'NOT MET'}")
        before = by.get(("paced", 128, "before"))
        if before:
            raised = paced["ttft_p50"] - before["ttft_p50"]
            print(f"  TTFT p50 at paced 128: {paced['ttft_p50']:.1f} ms vs {before['ttft_p50']:.1f} ms unbatched "
                  f"({raised:+.1f} ms; <= +5 ms: {'MET' if raised <= 5 else 'NOT MET'})")
    instant = [r for r in rows if r["mode"] == "instant" and r["variant"] == "after"]
    if instant:
        best = max(instant, key=lambda r: r["delivered"])
        print(f"  instant: best {best['delivered']:,.0f} tok/s at {best['streams']} streams (>= 20,000): "
              f"{'MET' if best['delivered'] >= 20000 else 'NOT MET'}")


# -- main ---------------------------------------------------------------------------------------
def wait_port(port: int, timeout_s: float = 60) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.2)
    raise TimeoutError(f"nothing listens on {port} after {timeout_s} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--modes", default="paced,instant")
    ap.add_argument("--streams", default="64,128,256,512")
    ap.add_argument("--variants", default="direct,bare,before,after",
                    help="direct: the fake behind a bare asyncio server, no Ray (the client's floor)")
    ap.add_argument("--tokens", type=int, default=200, help="tokens per stream, paced")
    ap.add_argument("--instant-tokens", type=int, default=400, help="tokens per stream, instant")
    ap.add_argument("--interval", type=float, default=0.02, help="seconds per token, paced")
    ap.add_argument("--duration", type=float, default=None,
                    help="seconds per cell, then every stream is cut (default: paced 4 request lengths, instant 20)")
    ap.add_argument("--after", type=json.loads, default={},
                    help="engine_deployment fields for the 'after' variant, as JSON (default: the platform's)")
    args = ap.parse_args()
    modes = args.modes.split(",")
    counts = [int(s) for s in args.streams.split(",")]
    variants = args.variants.split(",")

    import multiprocessing

    import ray
    from ray import serve

    from loraplex.config import EngineDeploymentConfig, PlatformConfig

    window_s = EngineDeploymentConfig(**args.after).stream_window_s
    model = PlatformConfig().engine.model_id
    os.environ["LORAPLEX_ADMIN_TOKEN"] = ADMIN  # replicas inherit it; it wins over the config
    # Ray runs workers at nice 15: the client (nice 0) and anything else on the machine would
    # take the cores from the replicas first. Measured replicas compete on equal terms.
    os.environ.setdefault("RAY_worker_niceness", "0")
    ray.init(num_cpus=8, object_store_memory=200_000_000, include_dashboard=False, logging_level="ERROR",
             log_to_driver=False)
    serve_port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": serve_port})
    rows, hop = [], []
    try:
        with tempfile.TemporaryDirectory(prefix="bench-stream-") as tmp:
            state = Path(tmp)
            model_dir = stub_model_dir(state, model)
            api_key = None
            for mode in modes:
                interval = args.interval if mode == "paced" else 0.0
                tokens = args.tokens if mode == "paced" else args.instant_tokens
                lifetime = tokens * interval  # one paced request's length: the closed loop's ramp
                duration = args.duration or (4 * lifetime if mode == "paced" else 20.0)
                for variant in variants:
                    t0 = time.time()
                    port, key, source, server = serve_port, None, None, None
                    if variant == "direct":
                        port = free_port()
                        server = multiprocessing.get_context("spawn").Process(
                            target=direct_server, args=(port, interval, model), daemon=True)
                        server.start()
                        wait_port(port)
                    elif variant == "bare":
                        serve.run(bare_app(interval, model), name=APP, route_prefix="/", blocking=False)
                        source = "BareTokens"
                    else:
                        streaming = {"stream_window_s": 0.0} if variant == "before" else args.after
                        deploy_platform(platform_args(state, model_dir, interval, streaming, max(counts)))
                        wait_http(f"http://127.0.0.1:{port}", "/readyz")
                        api_key = api_key or tenant_key(f"http://127.0.0.1:{port}")
                        key, source = api_key, "Engine"
                    arun(run_streams(port, key, model, 8, 10, 30))  # warm-up
                    print(f"[{mode} {variant}] up in {time.time() - t0:.0f} s", flush=True)
                    if variant == "bare" and mode == "instant":
                        h = serve.get_app_handle(APP)
                        for s in counts:
                            r = h.handle_hop.remote(s, tokens, duration).result()
                            hop.append({"streams": s, **r})
                            settle(source)
                    for s in counts:
                        r = arun(run_streams(port, key, model, s, tokens, duration, lifetime))
                        rows.append({**summarize(mode, variant, r, args.interval), "load": os.getloadavg()[0]})
                        x = rows[-1]
                        print(f"  {s} streams: {x['delivered']:,.0f} tok/s, TTFT p50 {x['ttft_p50']:.1f} ms, "
                              f"TPOT p99 +{x['tpot_p99']:.2f} ms, {x['requests']} requests, {x['failed']} failed", flush=True)
                        if source:
                            settle(source)
                    if server is not None:
                        server.terminate()
                        server.join(10)
                    else:
                        serve.delete(APP)
    finally:
        serve.shutdown()
        ray.shutdown()
    print_table(rows, hop)
    print_targets(rows, window_s)


if __name__ == "__main__":
    main()
