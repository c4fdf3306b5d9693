"""Overload: the real `serve run` at several times its measured capacity, real ShareGPT prompts.

    python -m bench overload [--duration 90] [--max-requests 900] [--overload-factor 3]

It starts `serve run` of a config derived from serve_config.yaml (two Engine replicas with
`num_cpus: 0.5`, `max_num_seqs: 4`, shedding `requests_by_priority: {0: 1, 50: 2, 100: 8}`
(priority 0 refused at 1 request in flight on a replica, 50 at 2, 100 at 8: the middle leaves
batch slots free for the top one) and vLLM's priority scheduling; its own SQLite database, spool and port
in a temporary directory), then, in one run:
1. capacity: a closed-loop ramp (concurrency 1, 2, 4, 8) of priority-100 tenants, so nothing is
   shed; capacity = the highest throughput (requests/s) of the ramp;
2. unloaded latency of the gold tenant (priority 100): its prompt pool, one request at a time,
   then its own overload arrivals (Poisson at its share of the overload rate) with no other tenant;
3. the overload: Poisson arrivals at --overload-factor x capacity for --duration s (at most
   --max-requests), from tenants made through the admin API: gold (priority 100, 8 % of the
   arrivals: about a quarter of capacity), silver (priority 50), capped (priority 50 and a
   `requests_per_minute` limit, set with PATCH once capacity is known, so 429s appear) and
   bronze (priority 0, most of the flood);
4. a table per tenant (offered, admitted, 429, 503, other, latency), gold's p95 under overload
   against its own traffic alone (target <= 2x: what the other tenants cost it) and against one
   request at a time, Retry-After on every 429/503;
5. peak RSS per kind of process of the run's process tree during the overload (psutil, every
   --sample-s), the CPU each kind used, what else used the machine's CPUs meanwhile, and the
   vLLM workers' CPU affinity;
6. no crash: a normal request after the overload, the same Engine replica processes as before,
   /readyz healthy, and the usage ledger (the run's SQLite database) holding exactly one record
   per admitted request and none for a refusal.

Prompts: the first user turn of ShareGPT conversations (bench/sharegpt.py), cut to
--max-prompt-tokens (256); max_tokens is the length of the conversation's answer, capped at
--max-tokens (32), so a request takes a few seconds on the 2-core CPU and the overload sends
enough gold requests for a p95 in a minute. Each request's message starts with
a unique tag so no request reuses another's prompt from the prefix cache (gold's pool is sent
in both phases). Writes nothing but stdout (the serve run log and database are deleted; the
log's tail is printed if the run fails; --serve-log keeps a copy). Takes about 4 minutes. Stop it with Ctrl-C: the
serve run and every process it started are stopped.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psutil

from bench.overload import phases
from bench.overload.checks import after_overload
from bench.overload.client import Client
from bench.overload.report import memory_table, tenant_table
from bench.overload.workload import MODEL, Prompt, build_prompts, write_config
from bench.processes import ROOT, port_in_use
from bench.serve_run import ServeRun


async def bench(args, out, run: ServeRun, client: Client, db_path: Path, prompts: list[Prompt]) -> int:
    o = await phases.setup(args, client, prompts)
    o.report = out
    await phases.capacity_ramp(o)
    await phases.gold_baselines(o)
    await phases.overload(o, run.proc.pid)
    tenant_table(o)
    memory_table(o)
    return await after_overload(o, db_path)


def parse_ladder(text: str) -> dict[int, int]:
    return {int(p): int(n) for p, n in (part.split(":") for part in text.split(","))}


def parse_shares(text: str) -> dict[str, float]:
    shares = {k: float(v) for k, v in (part.split("=") for part in text.split(","))}
    if set(shares) != {"gold", "silver", "capped", "bronze"}:
        raise argparse.ArgumentTypeError("--shares names gold, silver, capped and bronze")
    total = sum(shares.values())
    return {k: v / total for k, v in shares.items()}


def interrupted(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def add_arguments(ap) -> None:
    ap.add_argument("--duration", type=float, default=90, help="seconds of open-loop arrivals")
    ap.add_argument("--alone-duration", type=float, default=60,
                    help="seconds of gold's own arrivals alone (its latency without the other tenants)")
    ap.add_argument("--max-requests", type=int, default=900, help="at most this many open-loop arrivals")
    ap.add_argument("--overload-factor", type=float, default=3.0, help="open-loop rate / measured capacity")
    ap.add_argument("--shares", type=parse_shares, default=parse_shares("gold=0.08,silver=0.12,capped=0.15,bronze=0.65"),
                    help="each tenant's share of the arrivals")
    ap.add_argument("--capped-rpm", type=int, default=None,
                    help="capped's requests_per_minute (default: --capped-fraction of what it offers)")
    ap.add_argument("--capped-fraction", type=float, default=0.25)
    ap.add_argument("--ramp", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 4, 8])
    ap.add_argument("--ramp-requests-per-slot", type=int, default=2,
                    help="requests per level = this x concurrency + 4 (at least 6)")
    ap.add_argument("--gold-pool", type=int, default=12, help="gold's prompts: each once unloaded, cycled under load")
    ap.add_argument("--max-prompt-tokens", type=int, default=256)
    ap.add_argument("--max-tokens", type=int, default=32, help="cap of max_tokens (else the ShareGPT answer's length)")
    ap.add_argument("--shed-ladder", type=parse_ladder, default=parse_ladder("0:1,50:2,100:8"),
                    help="engine_deployment.shedding.requests_by_priority as priority:requests,...")
    ap.add_argument("--kv-tokens", type=int, default=8192, help="KV cache per Engine replica, in tokens")
    ap.add_argument("--sample-s", type=float, default=0.5, help="RSS sampling period")
    ap.add_argument("--port", type=int, default=8100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                    type=lambda kv: tuple(kv.split("=", 1)),
                    help="an environment variable for the serve run and every process it starts (repeatable), "
                         "e.g. VLLM_CPU_OMP_THREADS_BIND=nobind")
    ap.add_argument("--serve-log", type=Path, default=None,
                    help="keep a copy of the serve run's log there (default: it is deleted)")


def run(args, out) -> int:
    if port_in_use(args.port):
        sys.exit(f"port {args.port} is taken; pick another with --port")
    # SIGTERM as Ctrl-C: the finally below stops the serve run either way.
    signal.signal(signal.SIGTERM, interrupted)
    started = time.time()
    model_dir = ROOT / "models" / MODEL
    prompts = build_prompts(model_dir, args.max_prompt_tokens, args.max_tokens, args.seed)
    print(f"# Overload benchmark: {time.strftime('%Y-%m-%d %H:%M:%S')}, load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}, {os.cpu_count()} CPUs, "
          f"{psutil.virtual_memory().total / 2**30:.0f} GiB\n")
    print(f"platform: serve run of serve_config.yaml with 2 Engine replicas (num_cpus 0.5, max_num_seqs 4, "
          f"KV cache {args.kv_tokens} tokens each, float32), 1 ingress; shedding requests_by_priority={args.shed_ladder} "
          f"per replica; vLLM scheduling_policy=priority"
          + (f"; environment {' '.join(f'{k}={v}' for k, v in args.env)}" if args.env else ""))
    print(f"prompts: {len(prompts)} first user turns of ShareGPT conversations, cut to {args.max_prompt_tokens} tokens "
          f"(mean {statistics.mean(p.prompt_tokens for p in prompts):.0f}); max_tokens = the answer's length capped at "
          f"{args.max_tokens} (mean {statistics.mean(p.max_tokens for p in prompts):.1f}); temperature 0; "
          f"non-streaming chat completions", flush=True)

    admin_token = secrets.token_urlsafe(16)
    with tempfile.TemporaryDirectory(prefix="bench-overload-") as tmp_dir:
        tmp = Path(tmp_dir)
        run = ServeRun(write_config(tmp, args), port=args.port, log_path=tmp / "serve_run.log",
                       admin_token=admin_token, env=dict(args.env))
        code = 1
        try:
            t0 = time.time()
            run.wait_ready()
            print(f"serve run ready in {time.time() - t0:.0f} s", flush=True)

            async def go():
                client = Client(run.base_url, admin_token)
                try:
                    return await bench(args, out, run, client, tmp / "loraplex.db", prompts)
                finally:
                    await client.http.aclose()

            code = asyncio.run(go())
        except BaseException as exc:
            print(f"\nthe run stopped: {exc!r}\n--- serve run log (tail) ---\n{run.log_tail()}", flush=True)
            if not isinstance(exc, Exception):
                raise
        finally:
            t0 = time.time()
            run.stop()
            if args.serve_log:
                args.serve_log.write_bytes((tmp / "serve_run.log").read_bytes())
            print(f"\nserve run stopped in {time.time() - t0:.0f} s; whole run {time.time() - started:.0f} s", flush=True)
    return code

