"""The streaming client: raw asyncio, one HTTP/1.1 connection per request, counting `data: {`
events in the bytes (one per token from the fake) without parsing them."""

from __future__ import annotations

import asyncio
import json
import statistics
import time

TOKEN_EVENT_KEY = b"data: {"  # one per token in the fake's stream
DONE = b"data: [DONE]"


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



def chat_request(port: int, api_key: str | None, model: str, tokens: int, content: str = "Hi.") -> bytes:
    """One streamed chat request as raw HTTP/1.1 bytes (Connection: close)."""
    body = json.dumps({"model": model, "stream": True, "max_tokens": tokens,
                       "messages": [{"role": "user", "content": content}]}).encode()
    auth = f"Authorization: Bearer {api_key}\r\n" if api_key else ""
    return (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{auth}"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            ).encode() + body


async def stream(proto: "_SSEStream", port: int, timeout_s: float) -> "_SSEStream":
    """Send `proto`'s request and read its reply for at most `timeout_s` (then `cut`, and the
    connection closed: the server must abort the request); a refused connection leaves it unfinished."""
    try:
        await asyncio.get_running_loop().create_connection(lambda: proto, "127.0.0.1", port)
        await asyncio.wait_for(proto.done, timeout_s)
    except asyncio.TimeoutError:
        proto.cut = True
    except OSError:
        pass
    finally:
        if proto.transport is not None:
            proto.transport.close()
    return proto

async def run_streams(port: int, api_key: str | None, model: str, streams: int, tokens: int, duration: float,
                      lifetime: float = 0.0) -> dict:
    """`streams` concurrent streamed chat requests of `tokens` tokens; all cut after `duration` s.

    lifetime 0: one request per stream, all sent at once. Else a closed loop: each of `streams`
    workers sends requests back to back until the cut, the first ones spread over `lifetime`
    (one request's length), so that `streams` always run and arrive at a steady
    streams / lifetime per second. Measured: the requests sent after that ramp, when all
    `streams` run (all requests, if the platform is too slow for any to be sent then)."""
    loop = asyncio.get_running_loop()
    request = chat_request(port, api_key, model, tokens, "Stream, please.")
    protos: list[_SSEStream] = []
    t0 = time.perf_counter()
    deadline = t0 + duration

    async def one() -> _SSEStream:
        proto = _SSEStream(request, loop.create_future())
        protos.append(proto)
        return await stream(proto, port, max(0.0, deadline - time.perf_counter()))

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


def arun(coro):
    """Run the client on uvloop when there is one: it shares the cores with the platform."""
    try:
        import uvloop
        factory = uvloop.new_event_loop
    except ImportError:
        factory = None
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(coro)
