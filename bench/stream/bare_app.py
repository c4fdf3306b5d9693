"""The floors the platform's streaming is measured against: Ray Serve alone (`bare_app`: proxy ->
a minimal ingress deployment -> a minimal deployment around the fake, one item per token) and no
Ray at all (`direct_server`: the fake behind a bare asyncio HTTP server)."""

from __future__ import annotations

import asyncio
import json
import time

from bench.fake_engine import BenchmarkFakeEngine
from bench.stream.client import arun


def bare_app(interval: float, model: str, whole_reply: bool = False):
    """HTTP proxy -> BareIngress -> BareTokens over a streaming handle, one item and one body
    message per token: the platform's two hops without the platform. `whole_reply` sends a
    request's tokens as one item instead (the platform coalesces what is ready into one item, and
    an instant engine has every token ready at once: the per-request floor issue 21 compares with)."""
    from types import SimpleNamespace

    from ray import serve
    from starlette.responses import StreamingResponse

    from loraplex.engine.config import EngineConfig
    from loraplex.contract import RequestUsage

    @serve.deployment(max_ongoing_requests=4096)
    class BareTokens:
        def __init__(self):
            config = EngineConfig(model=model, engine_kwargs={"benchmark_token_interval_s": interval})
            self.engine = BenchmarkFakeEngine(config)

        async def stream(self, n: int, request_id: str = "bare"):
            request = SimpleNamespace(stream=True, max_tokens=n, model=model, request_id=request_id)
            usage = RequestUsage()
            if whole_reply:
                yield "".join([event async for event in self.engine.generate(None, request, usage)])
                return
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

    from loraplex.engine.config import EngineConfig
    from loraplex.contract import RequestUsage

    engine = BenchmarkFakeEngine(EngineConfig(model=model, engine_kwargs={"benchmark_token_interval_s": interval}))

    async def handle(reader, writer):
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            body = json.loads(await reader.readexactly(length))
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                         b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n")
            request = SimpleNamespace(stream=True, max_tokens=body["max_tokens"], model=model, request_id="direct")
            usage = RequestUsage()
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
