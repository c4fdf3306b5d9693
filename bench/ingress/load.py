"""Short streamed chat requests against one HTTP endpoint, open loop (Poisson arrivals at a rate,
whatever the server's pace) or as one burst (n at once), timed by bench/stream/client.py's
raw-asyncio SSE client: TTFT = first token - request sent."""

from __future__ import annotations

import asyncio
import random
import time

from bench.percentile import or_nan, percentile
from bench.stream.client import _SSEStream, chat_request, stream


async def _one(request: bytes, port: int, timeout_s: float) -> _SSEStream:
    return await stream(_SSEStream(request, asyncio.get_running_loop().create_future()), port, timeout_s)


def summary(protos: list[_SSEStream], tokens: int, started: float, offered: float | None) -> dict:
    ok = [p for p in protos if p.finished and p.tokens == tokens]
    ttft = [p.first - p.sent for p in ok]
    span = (max(p.last for p in ok) - started) if ok else float("nan")
    return {"offered_rps": offered, "sent": len(protos), "ok": len(ok), "failed": len(protos) - len(ok),
            "refused": sum(p.status in (429, 503) for p in protos),  # of the failed: refused at once, not cut
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
