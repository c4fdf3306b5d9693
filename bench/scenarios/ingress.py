"""The ingress's per-request cost: one ingress replica against a bare Ray Serve app of the same shape.

    python -m bench ingress [--rates 100,200] [--duration 8] [--burst 128] [--reps 7]

Short streamed chat requests (`--tokens` 8 output tokens) against an instant fake engine
(bench/fake_engine.py's BenchmarkFakeEngine: no model, every token at once), in one run:
- bare: Ray Serve alone, the platform's shape without the platform: HTTP proxy -> a trivial
  ingress deployment returning a StreamingResponse -> a trivial engine deployment around the
  same fake, through a `stream=True` handle, the reply's tokens in one item as the platform
  sends them (bench/stream/bare_app.py);
- platform: build_platform(args, engine_cls=BenchmarkFakeEngine): one Ingress replica (auth, parsing,
  admission, routing, metering) and one Engine replica, shedding off.
Each variant gets, after a warm-up: `--reps` bursts of `--burst` requests sent at once (TTFT p50
/ p99: what the ingress adds when requests arrive together), then open-loop Poisson arrivals at
each of `--rates` for `--duration` s (requests/s completed: past its capacity a variant
completes fewer than offered). The client (raw asyncio, bench/stream/client.py's SSE reader)
runs in this process and shares the two cores: its cost is in both variants alike. Printed: a
table side by side, the ratios platform / bare, and the targets of issue 21.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

from bench.ingress.load import burst, open_loop
from bench.ingress.profile import cpu_seconds_by_kind, replica_pids, start_recording, summarise
from bench.local_serve import local_serve
from bench.report import Table
from bench.stream.bare_app import bare_app
from bench.stream.client import arun
from bench.stream.platform import ADMIN, APP, deploy_platform, platform_args, stub_model_dir, wait_http
from bench.tenants import new_tenant_key

TODAY_TTFT_P50_MS = 986.0  # issue 21: 128 streams arriving together through one ingress replica


def measure(variant: str, port: int, key, model: str, args) -> list[dict]:
    rows = []
    arun(burst(port, key, model, 16, args.tokens))  # warm-up (not measured)
    recorders = profile_replicas(variant, "burst", args, seconds=args.reps * 3 + 2)
    cpu_before = cpu_seconds_by_kind()
    for rep in range(args.reps):
        r = arun(burst(port, key, model, args.burst, args.tokens))
        rows.append({"variant": variant, "load": f"burst {args.burst} (rep {rep + 1})", **r})
        print(f"  [{variant}] {rows[-1]['load']}: TTFT p50 {r['ttft_p50_ms']:.0f} ms, {r['failed']} failed", flush=True)
        time.sleep(1)
    cpu = cpu_seconds_by_kind() - cpu_before  # Counter subtraction keeps the positive
    requests = args.reps * args.burst
    print(f"  [{variant}] CPU ms per request in the bursts (the 1 s pauses included): " + ", ".join(
        f"{k.rsplit(':', 1)[-1]} {v / requests * 1e3:.2f}" for k, v in cpu.most_common()) +
        f"; total {sum(cpu.values()) / requests * 1e3:.2f}", flush=True)
    print_profiles(recorders)
    for rate in args.rates:
        recorders = profile_replicas(variant, rate, args, seconds=args.duration)
        r = arun(open_loop(port, key, model, rate, args.duration, args.tokens))
        print_profiles(recorders)
        rows.append({"variant": variant, "load": f"open {rate:g}/s", **r})
        print(f"  [{variant}] open {rate:g}/s: {r['rps']:.1f} req/s, TTFT p50 {r['ttft_p50_ms']:.0f} ms, "
              f"{r['failed']} failed", flush=True)
        time.sleep(1)
    return rows


def profile_replicas(variant: str, phase, args, seconds: float) -> list:
    """py-spy on the platform's Ingress and Engine replicas for --profile's phase: the bursts
    ("burst") or the open-loop phase at a rate."""
    if variant != "platform" or args.profile is None or phase != args.profile:
        return []
    out = Path(tempfile.mkdtemp(prefix="bench-ingress-profile-"))
    return [(name, out / f"{name}-{pid}.txt", start_recording(pid, seconds, out / f"{name}-{pid}.txt"))
            for name in ("Ingress", "Engine") for pid in replica_pids(APP, name)]


def print_profiles(recorders: list) -> None:
    for name, path, proc in recorders:
        proc.wait()
        rows = summarise(path) if path.exists() else []
        print(f"\n  py-spy, {name} replica ({path}): share of samples, inclusive / self")
        for function, own, inclusive in rows:
            print(f"    {inclusive:6.1%} {own:6.1%}  {function}")


def report(out, rows: list[dict], args) -> None:
    by = {(r["variant"], r["load"]): r for r in rows}
    table = Table("", [("load", "load"), ("bare_rps", "bare req/s", "{:.1f}"), ("platform_rps", "platform req/s", "{:.1f}"),
                       ("ratio", "platform/bare", "{:.2f}x"), ("bare_ttft_p50_ms", "bare TTFT p50 ms", "{:.0f}"),
                       ("platform_ttft_p50_ms", "platform TTFT p50 ms", "{:.0f}"),
                       ("added_ttft_p50_ms", "added TTFT p50 ms", "{:+.0f}"),
                       ("bare_ttft_p99_ms", "bare TTFT p99 ms", "{:.0f}"),
                       ("platform_ttft_p99_ms", "platform TTFT p99 ms", "{:.0f}"),
                       ("added_ttft_p99_ms", "added TTFT p99 ms", "{:+.0f}"),
                       ("failed", "failed (refused 429/503) bare/platform")])
    for load in dict.fromkeys(r["load"] for r in rows):
        b, p = by.get(("bare", load)), by.get(("platform", load))
        if not b or not p:
            continue
        table.add(load=load, bare_rps=b["rps"], platform_rps=p["rps"],
                  ratio=p["rps"] / b["rps"] if b["rps"] else None,
                  bare_ttft_p50_ms=b["ttft_p50_ms"], platform_ttft_p50_ms=p["ttft_p50_ms"],
                  added_ttft_p50_ms=p["ttft_p50_ms"] - b["ttft_p50_ms"], bare_ttft_p99_ms=b["ttft_p99_ms"],
                  platform_ttft_p99_ms=p["ttft_p99_ms"], added_ttft_p99_ms=p["ttft_p99_ms"] - b["ttft_p99_ms"],
                  failed=f"{b['failed']}/{p['failed']} ({b.get('refused', 0)}/{p.get('refused', 0)})")
    out.table(table)
    best = {v: max((r["rps"] for r in rows if r["variant"] == v and r["load"].startswith("open")), default=0.0)
            for v in ("bare", "platform")}
    bursts = {v: sorted(r["ttft_p50_ms"] for r in rows if r["variant"] == v and r["load"].startswith("burst"))
              for v in ("bare", "platform")}
    out.note("Targets (issue 21):")
    if best["bare"]:
        ratio = best["platform"] / best["bare"]
        out.note(f"  requests/s, best open-loop rate: platform {best['platform']:.1f} vs bare {best['bare']:.1f} = "
                 f"{ratio:.2f}x (>= 0.7x): {'MET' if ratio >= 0.7 else 'MISSED'}")
    if bursts["platform"]:
        median = bursts["platform"][len(bursts["platform"]) // 2]
        bare = f"; bare {bursts['bare'][len(bursts['bare']) // 2]:.0f} ms" if bursts["bare"] else ""
        out.note(f"  TTFT p50 at {args.burst} simultaneous (median of {len(bursts['platform'])} bursts): platform "
                 f"{median:.0f} ms vs today's {TODAY_TTFT_P50_MS:.0f} ms (<= half, {TODAY_TTFT_P50_MS / 2:.0f} ms): "
                 f"{'MET' if median <= TODAY_TTFT_P50_MS / 2 else 'MISSED'}{bare}")


def add_arguments(ap) -> None:
    ap.add_argument("--rates", type=lambda s: [float(x) for x in s.split(",")], default=[100, 200],
                    help="open-loop arrival rates, requests/s")
    ap.add_argument("--duration", type=float, default=8.0, help="seconds per open-loop rate")
    ap.add_argument("--burst", type=int, default=128, help="requests sent at once")
    ap.add_argument("--reps", type=int, default=7, help="bursts per variant")
    ap.add_argument("--tokens", type=int, default=8, help="output tokens per request")
    ap.add_argument("--variants", default="bare,platform")
    ap.add_argument("--profile", type=lambda s: s if s == "burst" else float(s), default=None, metavar="RATE|burst",
                    help="record the platform's Ingress and Engine replicas with py-spy during the open-loop phase "
                         "at this rate, or during the bursts, and print where their time goes")


def run(args, out) -> None:
    from ray import serve

    from loraplex.config import PlatformConfig

    model = PlatformConfig().engine.model_id
    out.note(f"# Ingress per-request cost: {time.strftime('%Y-%m-%d %H:%M:%S')}, load average "
             f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}, {os.cpu_count()} CPUs")
    rows = []
    with local_serve(admin_token=ADMIN) as port, tempfile.TemporaryDirectory(prefix="bench-ingress-") as tmp:
        state = Path(tmp)
        for variant in args.variants.split(","):
            t0 = time.time()
            key = None
            if variant == "bare":
                serve.run(bare_app(0.0, model, whole_reply=True), name=APP, route_prefix="/", blocking=False)
                while arun(burst(port, None, model, 1, args.tokens))["ok"] != 1:  # until it answers
                    time.sleep(0.5)
            else:
                deploy_platform(platform_args(state, stub_model_dir(state, model), 0.0, {}, args.burst))
                wait_http(f"http://127.0.0.1:{port}", "/readyz")
                key = new_tenant_key(f"http://127.0.0.1:{port}", ADMIN, "bench")
            print(f"[{variant}] up in {time.time() - t0:.0f} s", flush=True)
            rows += measure(variant, port, key, model, args)
            serve.delete(APP)
    report(out, rows, args)
