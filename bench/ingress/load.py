"""Short streamed chat requests against one HTTP endpoint, open loop (Poisson arrivals at a rate,
whatever the server's pace) or as one burst (n at once), timed by bench/stream/client.py's
raw-asyncio SSE client: TTFT = first token - request sent."""

from __future__ import annotations

import asyncio
import json
import random
import time

from bench.percentile import or_nan, percentile
from bench.stream.client import _SSEStream


def chat_request(port: int, api_key: str | None, model: str, tokens: int) -> bytes:
    body = json.dumps({"model": model, "stream": True, "max_tokens": tokens,
                       "messages": [{"role": "user", "content": "Hi."}]}).encode()
    auth = f"Authorization: Bearer {api_key}\r\n" if api_key else ""
    return (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{auth}"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            ).encode() + body


async def _one(request: bytes, port: int, timeout_s: float) -> _SSEStream:
    loop = asyncio.get_running_loop()
    proto = _SSEStream(request, loop.create_future())
    try:
        await loop.create_connection(lambda: proto, "127.0.0.1", port)
        await asyncio.wait_for(proto.done, timeout_s)
    except asyncio.TimeoutError:
        proto.cut = True
    except OSError:
        pass
    finally:
        if proto.transport is not None:
            proto.transport.close()
    return proto


def summary(protos: list[_SSEStream], tokens: int, started: float, offered: float | None) -> dict:
    ok = [p for p in protos if p.finished and p.tokens == tokens]
    ttft = [p.first - p.sent for p in ok]
    span = (max(p.last for p in ok) - started) if ok else float("nan")
    return {"offered_rps": offered, "sent": len(protos), "ok": len(ok), "failed": len(protos) - len(ok),
            "rps": len(ok) / span if ok else 0.0,
            "ttft_p50_ms": or_nan(percentile(ttft, 50)) * 1e3, "ttft_p99_ms": or_nan(percentile(ttft, 99)) * 1e3}


async def open_loop(port: int, api_key: str | None, model: str, rate: float, duration: float, tokens: int,
                    seed: int = 0, timeout_s: float = 60.0) -> dict:
    """Poisson arrivals at `rate`/s for `duration` s, each a streamed request of `tokens` tokens;
    requests/s = completed requests over the time from the first send to the last token."""
    request = chat_request(port, api_key, model, tokens)
    rng = random.Random(seed)
    at, schedule = 0.0, []
    while (at := at + rng.expovariate(rate)) < duration:
        schedule.append(at)
    tasks = []
    started = time.perf_counter()
    for t in schedule:
        delay = started + t - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.ensure_future(_one(request, port, timeout_s)))
    protos = await asyncio.gather(*tasks)
    return summary(protos, tokens, started, rate)


async def burst(port: int, api_key: str | None, model: str, n: int, tokens: int, timeout_s: float = 60.0) -> dict:
    """`n` streamed requests sent at once."""
    request = chat_request(port, api_key, model, tokens)
    started = time.perf_counter()
    protos = await asyncio.gather(*(_one(request, port, timeout_s) for _ in range(n)))
    return summary(protos, tokens, started, None)
