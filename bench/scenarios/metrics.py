"""What the `loraplex_*` metrics cost per request and per token: metrics on vs off, side by side.

    python -m bench metrics [--requests 3000] [--tokens 1,64] [--platform-seconds 15]
                            [--concurrency 32] [--tenants 50] [--skip-platform]

Two measurements in one run, each alternating off / on so drift hits both alike:

1. replica path (in-process, exact): the real Engine replica class (`Engine.generate`: shedding,
   coalescing, the Meter writing the usage record to the real ledger and the metrics from it)
   around `InstantFakeEngine`, a fake vLLM that makes every token at once and counts each through
   the real `record_output` (as UsageTrackingAsyncLLM does for vLLM's outputs), one request at a
   time. With metrics on, values go to Ray's real metric objects (ray.init'ed driver: the core
   worker's exporter) and the replica's publisher thread runs. Per request: time of the whole
   request, compared at the median (the mean carries whatever else the machine runs); per token:
   the slope of the median between the token counts.
2. platform (over HTTP, end to end): the real ingress, router and Engine deployment behind Serve's
   proxy with bench_stream's instant `BenchmarkFakeEngine`, `--concurrency` closed-loop clients
   sending non-stream chat requests as `--tenants` tenants: requests/s with
   `metrics: {enabled: false}` vs the default. The client shares the cores: noisy, so it runs
   off/on twice.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path

from bench.fake_engine import BenchmarkFakeEngine
from bench.local_serve import local_serve
from bench.percentile import percentile
from bench.report import Table
from bench.state import with_fresh_state
from bench.stream.platform import ADMIN, APP, deploy_platform, platform_args, stub_model_dir, wait_http


# -- 1. the replica path, in-process -------------------------------------------------------------
class InstantFakeEngine(BenchmarkFakeEngine):
    """bench_stream's fake vLLM (every token at once), counting each token through the real
    `record_output` from a vLLM RequestOutput with request stats, as UsageTrackingAsyncLLM does
    for the real engine: so the per-token path the metrics touch (queue time) is measured."""

    def __init__(self, config, replica_id: str = "", adapter_store=None, metrics=None):
        super().__init__(config, replica_id, adapter_store, metrics)
        from vllm.outputs import CompletionOutput, RequestOutput
        from vllm.v1.metrics.stats import RequestStateStats

        self._output = lambda rid, i, n: RequestOutput(
            request_id=rid, prompt=None, prompt_token_ids=list(range(8)), prompt_logprobs=None,
            outputs=[CompletionOutput(index=0, text=" tok", token_ids=[i], cumulative_logprob=None, logprobs=None,
                                      finish_reason="length" if i == n - 1 else None)],
            finished=i == n - 1, num_cached_tokens=0,
            metrics=RequestStateStats(arrival_time=time.time(), queued_ts=time.monotonic(),
                                      scheduled_ts=time.monotonic()))

    async def _tokens(self, n, usage):
        from vllm.sampling_params import RequestOutputKind

        from loraplex.engine.usage_tracking import record_output

        rid = usage.engine_request_ids[0]
        usage.prompt_tokens = 0  # record_output counts the prompt from the first output
        for i in range(n):
            record_output(usage, self._output(rid, i, n), RequestOutputKind.DELTA)
            yield i
            await asyncio.sleep(0)
        usage.status = "length"
        usage.finish_time = time.time()


def replica_config(state: Path, metrics_on: bool, model_dir: Path):
    from loraplex.config import PlatformConfig

    args = with_fresh_state({
        "engine": {"model": str(model_dir), "engine_kwargs": {"benchmark_token_interval_s": 0.0}},
        # Measured one at a time: nothing to shed, every chunk sent alone (no coalescing window).
        "engine_deployment": {"shedding": {"enabled": False}, "stream_window_s": 0.0},
        "metrics": {"enabled": metrics_on},
    }, state)
    args["accounting"]["spool_dir"] = str(state / f"spool-{metrics_on}")  # one database, a spool per replica
    return PlatformConfig.from_args(args)


async def replica_path(args, state: Path, model_dir: Path) -> list[dict]:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    from loraplex.engine.deployment import Engine
    from loraplex.contract import AdapterTarget, EngineCall

    state.mkdir(parents=True, exist_ok=True)
    replicas = {}
    for on in (False, True):
        replica = Engine.__new__(Engine)
        await replica.__init__(replica_config(state, on, model_dir), engine_cls=InstantFakeEngine)
        replicas[on] = replica
    adapter = AdapterTarget("t/bot@abc", 1, "t", "bot", "abc", requested_as="bot", version=1)
    model = replicas[False].base_model

    async def one(replica, i: int, tokens: int) -> None:
        tenant = f"ten_{i % args.tenants:04d}"
        call = EngineCall(request_id=f"r{tokens}-{i}-{id(replica)}", tenant_id=tenant, api_key_id="key",
                          adapter=adapter if i % 2 else None, arrival_time=time.time(), stream=True,
                          routing_key=tenant)
        request = ChatCompletionRequest(model=model, messages=[{"role": "user", "content": "hi"}],
                                        max_tokens=tokens, stream=True)
        async for _ in replica.generate(call, request):
            pass

    rows = []
    block = 250
    try:
        for tokens in args.tokens:
            times = {False: [], True: []}
            for on in (False, True):  # warm-up
                for i in range(100):
                    await one(replicas[on], i, tokens)
            for start in range(0, args.requests, block):
                for on in (False, True):
                    for i in range(start, min(start + block, args.requests)):
                        t0 = time.perf_counter()
                        await one(replicas[on], i, tokens)
                        times[on].append(time.perf_counter() - t0)
            for on in (False, True):
                xs = times[on]
                rows.append({"tokens": tokens, "metrics": "on" if on else "off", "n": len(xs),
                             "rps": len(xs) / sum(xs), "mean_us": statistics.mean(xs) * 1e6,
                             "p50_us": statistics.median(xs) * 1e6,
                             "p99_us": percentile(xs, 99) * 1e6, "max_us": max(xs) * 1e6})
            print(f"  replica path, {tokens} tokens: done", flush=True)
    finally:
        for replica in replicas.values():
            await replica.__del__()
    return rows


# -- 2. the platform over HTTP -------------------------------------------------------------------
def tenant_keys(base_url: str, n: int) -> list[str]:
    import httpx

    admin = {"Authorization": f"Bearer {ADMIN}"}
    keys = []
    with httpx.Client(base_url=base_url, headers=admin, timeout=60) as c:
        for i in range(n):
            t = c.post("/admin/tenants", json={"name": f"bench-{i}"})
            t.raise_for_status()
            k = c.post(f"/admin/tenants/{t.json()['id']}/keys")
            k.raise_for_status()
            keys.append(k.json()["key"])
    return keys


async def closed_loop(base_url: str, keys: list[str], model: str, concurrency: int, seconds: float,
                      tokens: int) -> dict:
    import httpx

    done, failed = 0, 0
    stop = time.monotonic() + seconds
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": tokens}

    async def client(j: int):
        nonlocal done, failed
        async with httpx.AsyncClient(base_url=base_url, timeout=60) as c:
            i = j
            while time.monotonic() < stop:
                r = await c.post("/v1/chat/completions", json=body,
                                 headers={"Authorization": f"Bearer {keys[i % len(keys)]}"})
                if r.status_code == 200:
                    done += 1
                else:
                    failed += 1
                i += concurrency

    t0 = time.monotonic()
    await asyncio.gather(*(client(j) for j in range(concurrency)))
    return {"requests": done, "failed": failed, "rps": done / (time.monotonic() - t0)}


def platform(args, port: int, state: Path, model_dir: Path, model: str) -> list[dict]:
    from ray import serve

    base_url = f"http://127.0.0.1:{port}"
    state.mkdir(parents=True, exist_ok=True)
    rows, keys = [], None
    for rep in range(args.platform_reps):
        for on in (False, True):
            d = platform_args(state, model_dir, 0.0, {}, args.concurrency)
            d["metrics"] = {"enabled": on}
            deploy_platform(d)
            wait_http(base_url, "/readyz")
            keys = keys or tenant_keys(base_url, args.tenants)  # one database: tenants outlive redeploys
            asyncio.run(closed_loop(base_url, keys, model, args.concurrency, 3.0, args.platform_tokens))  # warm-up
            r = asyncio.run(closed_loop(base_url, keys, model, args.concurrency, args.platform_seconds,
                                        args.platform_tokens))
            rows.append({"rep": rep + 1, "metrics": "on" if on else "off", **r, "load": os.getloadavg()[0]})
            print(f"  platform rep {rep + 1} metrics {'on' if on else 'off'}: {r['rps']:.1f} req/s "
                  f"({r['failed']} failed)", flush=True)
            serve.delete(APP)
    return rows


# -- report ---------------------------------------------------------------------------------------
def report(out, replica_rows: list[dict], platform_rows: list[dict]) -> None:
    out.table(Table("Replica path (Engine.generate + Meter + ledger, instant fake vLLM, one request at a time):",
                    [("tokens", "tokens/request", "{:d}"), ("metrics", "metrics"), ("n", "requests", "{:d}"),
                     ("rps", "req/s", "{:,.0f}"), ("mean_us", "mean us/request", "{:.1f}"), ("p50_us", "p50 us", "{:.1f}"),
                     ("p99_us", "p99 us", "{:.1f}"), ("max_us", "max us", "{:,.0f}")], replica_rows))
    by = {(r["tokens"], r["metrics"]): r for r in replica_rows}
    counts = sorted({r["tokens"] for r in replica_rows})
    # The median is what a request costs; the mean also carries whatever else ran on the machine.
    for t in counts:
        off, on = by[(t, "off")], by[(t, "on")]
        out.note(f"{t} tokens: metrics on/off req/s = {off['p50_us'] / on['p50_us']:.3f} at the median request "
                 f"({on['rps'] / off['rps']:.3f} by the mean); cost +{on['p50_us'] - off['p50_us']:.1f} us/request (p50), "
                 f"{on['mean_us'] - off['mean_us']:+.1f} (mean)")
    if len(counts) >= 2:
        lo, hi = counts[0], counts[-1]
        per_token = {m: (by[(hi, m)]["p50_us"] - by[(lo, m)]["p50_us"]) / (hi - lo) for m in ("off", "on")}
        out.note(f"per token (slope {lo}->{hi} tokens, p50): off {per_token['off']:.2f} us, on {per_token['on']:.2f} us, "
                 f"metrics +{per_token['on'] - per_token['off']:.2f} us/token")
    if platform_rows:
        out.table(Table("Platform over HTTP (ingress + router + Engine, instant BenchmarkFakeEngine, closed loop):",
                        [("rep", "rep", "{:d}"), ("metrics", "metrics"), ("requests", "requests", "{:d}"),
                         ("failed", "failed", "{:d}"), ("rps", "req/s", "{:.1f}"), ("load", "load avg", "{:.1f}")],
                        platform_rows))
        mean = {m: statistics.mean(r["rps"] for r in platform_rows if r["metrics"] == m) for m in ("off", "on")}
        out.note(f"platform: metrics on/off req/s = {mean['on'] / mean['off']:.3f} "
                 f"(mean of {len(platform_rows) // 2} runs each: on {mean['on']:.1f}, off {mean['off']:.1f})")


def add_arguments(ap) -> None:
    ap.add_argument("--requests", type=int, default=3000, help="requests per variant, replica path")
    ap.add_argument("--tokens", type=lambda v: [int(t) for t in v.split(",")], default=[1, 64],
                    help="tokens per request, replica path")
    ap.add_argument("--tenants", type=int, default=50)
    ap.add_argument("--concurrency", type=int, default=32, help="closed-loop clients, platform")
    ap.add_argument("--platform-seconds", type=float, default=15.0)
    ap.add_argument("--platform-tokens", type=int, default=16)
    ap.add_argument("--platform-reps", type=int, default=3)
    ap.add_argument("--skip-platform", action="store_true")


def run(args, out) -> None:
    from loraplex.config import PlatformConfig

    model = PlatformConfig().engine.model_id
    platform_rows = []
    with local_serve(admin_token=ADMIN) as port, tempfile.TemporaryDirectory(prefix="bench-metrics-") as tmp:
        state = Path(tmp)
        model_dir = stub_model_dir(state, model)
        replica_rows = asyncio.run(replica_path(args, state / "replica", model_dir))
        if not args.skip_platform:
            platform_rows = platform(args, port, state / "platform", model_dir, model)
    report(out, replica_rows, platform_rows)
