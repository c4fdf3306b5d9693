#!/usr/bin/env python
"""Admission benchmark: what a tenant-limit check adds to each request.

Times exactly what the ingress runs per request (Limiter.admit, then the release at the end of
the engine stream) against the real shared state (a LimiterActor in a local Ray cluster), side
by side in one run:
  - no limits: a tenant without limits (must cost ~nothing: no lease, no round trip);
  - limits, leased: all four limits set, the replica spends leased slices locally (production);
  - limits, a round trip each: slice_fraction tiny, so every admission asks the actor (what a
    tenant with very small limits pays, and what the design without leases would cost).

    python scripts/bench_admission.py [--requests 5000] [--local]   (--local: no Ray, in-process state)
"""
import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

from loraplex.admission.config import LimiterConfig
from loraplex.admission.limiter import Limiter, LocalBackend
from loraplex.contract import EngineCall, EngineChunk
from loraplex.tenancy.models import TenantLimits

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/ sits at the repository root
from bench.percentile import percentile  # noqa: E402

LIMITS = TenantLimits(requests_per_minute=10_000_000, tokens_per_minute=10**12, max_concurrent_requests=1000,
                      monthly_token_budget=10**15)
CHUNK = EngineChunk(b"{}", 40, 0, 20)


async def one_stream():
    yield CHUNK


async def run(limiter: Limiter, principal, n: int) -> list[float]:
    times = []
    for i in range(n):
        call = EngineCall(request_id=f"r{i}", tenant_id=principal.tenant_id, prompt_tokens=40, max_tokens=64)
        t0 = time.perf_counter()
        admission = await limiter.admit(principal, call)
        async for _ in admission.track(one_stream()):
            pass
        times.append(time.perf_counter() - t0)
        if i % 200 == 0:
            await asyncio.sleep(0)  # let the sweeper and give-backs run, as between real requests
    return times


async def main(args):
    if args.local:
        backend_factory = lambda: LocalBackend()  # noqa: E731
    else:
        import ray

        from loraplex.admission.ray_backend import RayBackend

        ray.init(num_cpus=1, include_dashboard=False, logging_level="ERROR", namespace="serve")
        backend_factory = lambda: RayBackend("bench", None)  # noqa: E731
    backend = backend_factory()
    cases = [
        ("no limits", Limiter(backend, LimiterConfig()), TenantLimits()),
        ("limits, leased (production)", Limiter(backend, LimiterConfig()), LIMITS),
        ("limits, a round trip each", Limiter(backend, LimiterConfig(slice_fraction=1e-12)), LIMITS),
    ]
    warm = SimpleNamespace(tenant_id="warm", limits=LIMITS)
    await run(cases[1][1], warm, 200)  # start the actor, warm the connections
    rows = []
    for name, limiter, limits in cases:
        principal = SimpleNamespace(tenant_id=f"t-{len(rows)}", limits=limits)
        n = args.requests if "round trip" not in name else min(args.requests, 2000)
        times = await run(limiter, principal, n)
        rows.append((name, n, percentile(times, 50) * 1e6, percentile(times, 99) * 1e6, statistics.mean(times) * 1e6))
    base = rows[0]
    print(f"shared state: {'in-process' if args.local else 'LimiterActor (Ray, same node)'}; "
          f"admit + release per request")
    print(f"{'case':32} {'n':>6} {'p50 us':>8} {'p99 us':>8} {'mean us':>8} {'p50 x':>7} {'added p50 us':>13}")
    for name, n, p50, p99, mean in rows:
        print(f"{name:32} {n:6d} {p50:8.1f} {p99:8.1f} {mean:8.1f} {p50 / base[2]:7.1f} {p50 - base[2]:13.1f}")
    if not args.local:
        import ray
        ray.shutdown()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=5000)
    p.add_argument("--local", action="store_true")
    asyncio.run(main(p.parse_args()))
