"""One level of load: closed loop (`concurrency` requests always in flight) or open loop
(requests sent at arrival times, whether or not earlier ones finished)."""

from __future__ import annotations

import asyncio
import random
from typing import Optional

import httpx

from bench.loadtest.arrivals import arrival_offsets
from bench.loadtest.client import Target, send


def _client(target: Target, connections: int) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=connections + 4, max_keepalive_connections=connections + 4)
    return httpx.AsyncClient(base_url=target.base_url, timeout=httpx.Timeout(1800, connect=30), limits=limits)


def _bar(total: int, desc: str, enabled: bool):
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="req", dynamic_ncols=True, leave=True)


async def run_closed(target: Target, workload, concurrency: int, *, temperature: float = 0.0,
                     progress: bool = True, desc: str = "") -> list[dict]:
    queue = list(workload.requests)
    queue.reverse()
    results: list[dict] = []
    bar = _bar(len(queue), desc or f"{target.name} c={concurrency}", progress)

    async def worker(client):
        while queue:
            spec = queue.pop()
            results.append(await send(client, target, spec, workload.tenants, temperature))
            if bar:
                bar.update(1)

    try:
        async with _client(target, concurrency) as client:
            await asyncio.gather(*(worker(client) for _ in range(concurrency)))
    finally:
        if bar:
            bar.close()
    return sorted(results, key=lambda r: r["index"])


async def run_open(target: Target, workload, rate: Optional[float], *, burstiness: float = 1.0,
                   max_concurrency: Optional[int] = None, seed: int = 0, temperature: float = 0.0,
                   progress: bool = True, desc: str = "", time_scale: float = 1.0) -> list[dict]:
    """rate None: the trace's own arrival times (arrival_s, scaled by time_scale)."""
    reqs = workload.requests
    if rate is None:
        if any(r.arrival_s is None for r in reqs):
            raise SystemExit("loadtest: open loop without --rate needs arrival_s on every trace line")
        base = min(r.arrival_s for r in reqs)
        offsets = [(r.arrival_s - base) * time_scale for r in reqs]
    else:
        offsets = arrival_offsets(len(reqs), rate, burstiness, random.Random(seed))
    sem = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    bar = _bar(len(reqs), desc or f"{target.name} rate={rate}", progress)
    loop = asyncio.get_running_loop()

    async def one(client, spec, at):
        delay = t0 + at - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        if sem:
            async with sem:
                r = await send(client, target, spec, workload.tenants, temperature)
        else:
            r = await send(client, target, spec, workload.tenants, temperature)
        r["scheduled_s"] = at
        if bar:
            bar.update(1)
        return r

    try:
        async with _client(target, max_concurrency or 256) as client:
            t0 = loop.time()
            results = await asyncio.gather(*(one(client, s, at) for s, at in zip(reqs, offsets)))
    finally:
        if bar:
            bar.close()
    return list(results)
