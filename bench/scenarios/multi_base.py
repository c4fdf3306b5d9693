"""Two base models in one `serve run` (issue 35): does load on one base slow the other's tenants?

For each variant, one `serve run` of serve_config.multi.yaml (state in a temp dir): a light tenant
sends --requests chats one after another to the second base (the 4-bit build) alone, then again
while a heavy tenant keeps --flood requests in flight on the first base. Prints each phase's
latency and the ratio beside / alone (the issue's target: p95 within 1.2x), the flood's answers
and the light tenant's refusals. Variants:
- `pinned`: the shipped config, each pool on its own core (engine_deployment.cpu_affinity); the
  front door (Ray, Serve's proxy and controller, the Ingress) floats over both cores;
- `front-door`: the same started as `taskset -c 0 serve run`: the front door and this load
  generator on the flooded pool's core, the light pool's core left to it alone;
- `unpinned`: that without cpu_affinity (both pools' vLLM share both cores).

    flock /tmp/loraplex-bench.lock python -m bench multi_base [--variants pinned,front-door,unpinned]
"""

from __future__ import annotations

import concurrent.futures
import os
import secrets
import tempfile
import threading
import time
from pathlib import Path

import httpx
import yaml

from bench.percentile import percentile
from bench.processes import ROOT
from bench.report import Table
from bench.serve_run import ServeRun
from bench.state import with_fresh_state
from bench.tenants import new_tenant_key

CONFIG = ROOT / "serve_config.multi.yaml"
PORT = 8000  # serve_config.multi.yaml's http_options
ALL_CPUS = os.sched_getaffinity(0)  # a variant that pinned the client must not pin the next one's


def variant_config(tmp: Path, variant: str) -> Path:
    config = yaml.safe_load(CONFIG.read_text())
    args = config["applications"][0]["args"]
    with_fresh_state(args, tmp)
    if variant == "unpinned":  # (front-door: the pinned config, started differently)
        for base in args["models"]:
            base["engine_deployment"].pop("cpu_affinity", None)
    path = tmp / f"serve_config.{variant}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def chat(base_url: str, key: str, model: str, max_tokens: int) -> tuple[int, float]:
    started = time.perf_counter()
    r = httpx.post(f"{base_url}/v1/chat/completions", headers={"Authorization": f"Bearer {key}"}, timeout=300,
                   json={"model": model, "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0,
                         "messages": [{"role": "user", "content": "Name a colour."}]})
    return r.status_code, time.perf_counter() - started


def run_variant(variant: str, args) -> dict:
    token = secrets.token_urlsafe(16)
    os.sched_setaffinity(0, ALL_CPUS)
    with tempfile.TemporaryDirectory(prefix=f"bench-multi-{variant}-") as tmp:
        tmp = Path(tmp)
        models = yaml.safe_load(CONFIG.read_text())["applications"][0]["args"]["models"]
        front_door = set(models[0]["engine_deployment"]["cpu_affinity"]) if variant == "front-door" else None
        client_cpus = args.client_cpus or front_door
        run = ServeRun(variant_config(tmp, variant), port=PORT, log_path=tmp / "serve_run.log", admin_token=token,
                       cpus=front_door)
        try:
            run.wait_ready()
            if client_cpus:  # after serve run started (its processes keep theirs): this thread and the
                os.sched_setaffinity(0, client_cpus)  # client threads it starts from here on
            heavy_base, light_base = (Path(m["engine"]["model"]).name for m in models[:2])
            light = new_tenant_key(run.base_url, token, "light")
            heavy = new_tenant_key(run.base_url, token, "heavy", {"max_concurrent_requests": 10_000})  # a flood
            for _ in range(2):
                chat(run.base_url, light, light_base, args.tokens)  # warm
            alone = [chat(run.base_url, light, light_base, args.tokens) for _ in range(args.requests)]
            stop, flood = threading.Event(), []

            def flood_loop():
                while not stop.is_set():
                    flood.append(chat(run.base_url, heavy, heavy_base, args.flood_tokens)[0])
            with concurrent.futures.ThreadPoolExecutor(args.flood) as pool:
                loops = [pool.submit(flood_loop) for _ in range(args.flood)]
                time.sleep(args.settle_s)
                beside = [chat(run.base_url, light, light_base, args.tokens) for _ in range(args.requests)]
                stop.set()
                for loop in loops:
                    loop.result()
        finally:
            run.stop()
    ok = lambda phase: [s for code, s in phase if code == 200]  # noqa: E731
    return {"variant": variant, "alone": ok(alone), "beside": ok(beside),
            "refused": sum(code != 200 for code, _ in alone + beside), "flood": flood}


def add_arguments(p) -> None:
    p.add_argument("--variants", default="pinned", help="of pinned, front-door, unpinned (comma list)")
    p.add_argument("--requests", type=int, default=20, help="the light tenant's chats per phase")
    p.add_argument("--tokens", type=int, default=16, help="output tokens of a light chat")
    p.add_argument("--flood", type=int, default=24, help="heavy requests kept in flight on the first base")
    p.add_argument("--flood-tokens", type=int, default=64)
    p.add_argument("--settle-s", type=float, default=5.0, help="flood time before the light tenant's phase")
    p.add_argument("--client-cpus", type=lambda v: {int(c) for c in v.split(",")}, default=None,
                   help="CPUs this load generator runs on, e.g. 0 (the flooded pool's core), so the client "
                   "does not take the light pool's core; default: any (front-door: the flooded pool's core)")


def run(args, out) -> None:
    results = [run_variant(v, args) for v in args.variants.split(",")]
    table = Table(f"multi_base: light tenant {args.requests} x {args.tokens}-token chats on the second base, alone and "
                  f"beside {args.flood} x {args.flood_tokens}-token requests in flight on the first "
                  "(serve_config.multi.yaml)",
                  [("variant", "variant"), ("alone_p50", "light p50 alone s", "{:.3f}"),
                   ("alone_p95", "light p95 alone s", "{:.3f}"), ("beside_p50", "light p50 beside s", "{:.3f}"),
                   ("beside_p95", "light p95 beside s", "{:.3f}"),
                   ("ratio", "p95 beside / alone (target <= 1.2x)", "**{:.2f}x**"), ("refused", "light refused", "{:d}"),
                   ("flood", "flood answered (non-200)")])
    for r in results:
        a95, b95 = percentile(r["alone"], 95), percentile(r["beside"], 95)
        table.add(variant=r["variant"], alone_p50=percentile(r["alone"], 50), alone_p95=a95,
                  beside_p50=percentile(r["beside"], 50), beside_p95=b95, ratio=b95 / a95 if a95 and b95 else None,
                  refused=r["refused"], flood=f"{len(r['flood'])} ({sum(c != 200 for c in r['flood'])})")
    out.table(table)
