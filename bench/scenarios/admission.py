"""Admission benchmark: what a tenant-limit check adds to each request.

Times exactly what the ingress runs per request (Limiter.admit, then the release at the end of
the engine stream) against the real shared state (a LimiterActor in a local Ray cluster), side
by side in one run:
  - no limits: a tenant without limits (must cost ~nothing: no lease, no round trip);
  - limits, leased: all four limits set, the replica spends leased slices locally (production);
  - limits, a round trip each: slice_fraction tiny, so every admission asks the actor (what a
    tenant with very small limits pays, and what the design without leases would cost).

    python -m bench admission [--requests 5000] [--local]   (--local: no Ray, in-process state)
"""
import asyncio
import statistics
import time
from types import SimpleNamespace

from loraplex.admission.config import LimiterConfig
from loraplex.admission.limiter import Limiter, LocalBackend
from loraplex.contract import EngineCall, EngineChunk
from loraplex.tenancy.models import TenantLimits

from bench.percentile import percentile
from bench.report import Table

LIMITS = TenantLimits(requests_per_minute=10_000_000, tokens_per_minute=10**12, max_concurrent_requests=1000,
                      monthly_token_budget=10**15)
CHUNK = EngineChunk(b"{}", 40, 0, 20)


async def one_stream():
    yield CHUNK


async def timed(limiter: Limiter, principal, n: int) -> list[float]:
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


def add_arguments(p) -> None:
    p.add_argument("--requests", type=int, default=5000)
    p.add_argument("--local", action="store_true", help="no Ray: the shared state in-process")


def run(args, out) -> None:
    asyncio.run(measure(args, out))


async def measure(args, out) -> None:
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
    await timed(cases[1][1], warm, 200)  # start the actor, warm the connections
    table = Table(f"shared state: {'in-process' if args.local else 'LimiterActor (Ray, same node)'}; "
                  "admit + release per request",
                  [("case", "case"), ("n", "n", "{:d}"), ("p50_us", "p50 us", "{:.1f}"), ("p99_us", "p99 us", "{:.1f}"),
                   ("mean_us", "mean us", "{:.1f}"), ("p50_x", "p50 x", "{:.1f}"),
                   ("added_p50_us", "added p50 us", "{:.1f}")])
    for i, (name, limiter, limits) in enumerate(cases):
        principal = SimpleNamespace(tenant_id=f"t-{i}", limits=limits)
        n = args.requests if "round trip" not in name else min(args.requests, 2000)
        times = await timed(limiter, principal, n)
        table.add(case=name, n=n, p50_us=percentile(times, 50) * 1e6, p99_us=percentile(times, 99) * 1e6,
                  mean_us=statistics.mean(times) * 1e6)
    base = table.rows[0]["p50_us"]
    for row in table.rows:
        row.update(p50_x=row["p50_us"] / base, added_p50_us=row["p50_us"] - base)
    out.table(table)
    if not args.local:
        import ray
        ray.shutdown()
