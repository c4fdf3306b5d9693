"""A hot adapter on the LoRA path vs on its merged dedicated replica vs the base model (issue 22
part 3), side by side in one `serve run`.

    python -m bench merged [--concurrency 8] [--requests 40] [--max-tokens 64] [--port 8000]

One run of the shipped config with its state in a temp dir: one tenant owns the pirate adapter
under two names with the same weights: `pirate` (marked dedicated: a Merged-<id> Engine replica of
the same size as the LoRA pool's one replica, num_cpus 0.75 each) and `pirate-lora` (the LoRA
pool). Phases, one after the other, the same requests each (ShareGPT-free fixed prompts, every
request exactly --max-tokens tokens: ignore_eos, greedy): the base model on the pool's replica,
`pirate-lora` on the pool's replica (vLLM's LoRA), `pirate` on its merged replica. Prints output
tok/s, TTFT p50/p95 and TPOT p50 per phase, and the ratios merged / base and LoRA / base
(target: merged >= 0.9x base), plus the usage records per path (every merged request billed as
`merged`). Run it alone (HEAVY_EXCLUSIVE=1 on the shared machine): ~6 min.
"""

from __future__ import annotations

import asyncio
import secrets
import tempfile
import time
from pathlib import Path

import httpx
import yaml

from bench.dedicated import seeded_config
from bench.loadtest.client import Target
from bench.loadtest.runner import run_closed
from bench.loadtest.stats import summarize
from bench.loadtest.workload import RequestSpec, Tenant, Workload
from bench.report import Table
from bench.serve_run import ServeRun

MODEL = "SmolLM2-135M-Instruct"
PROMPTS = ["Tell me about the sea.", "What is the capital of France?", "Describe a ship in a storm.",
           "How do I cook rice?", "Write a short poem about the wind.", "Why is the sky blue?"]


def workload(adapter: int | None, n: int, max_tokens: int, offset: int) -> Workload:
    # A different number in each phase's prompts: no phase hits the prefix cache of another.
    requests = [RequestSpec(index=i, tenant=0, adapter=adapter, max_tokens=max_tokens, system=False, ignore_eos=True,
                            user_text=f"{PROMPTS[i % len(PROMPTS)]} ({offset + i})") for i in range(n)]
    return Workload([Tenant("bench", "")], [(0, 0), (0, 1)], requests, "bench_merged", exact_lengths=False)


def wait_merged_healthy(base_url: str, admin_token: str, adapter_id: int, timeout_s: float = 900) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        shown = httpx.get(f"{base_url}/admin/dedicated", headers={"Authorization": f"Bearer {admin_token}"}, timeout=30)
        if any(d["adapter_id"] == adapter_id and d["healthy"] for d in shown.json().get("data", [])):
            return
        time.sleep(2)
    raise SystemExit(f"bench_merged: the merged replica of adapter {adapter_id} was not healthy after {timeout_s} s")


def paths_billed(database_url: str, tenant: str) -> dict:
    from sqlalchemy import func, select

    from loraplex.accounting.tables import usage_records
    from loraplex.db.engine import make_engine

    t = usage_records
    with make_engine(database_url).connect() as conn:
        rows = conn.execute(select(t.c.adapter, t.c.path, func.count()).where(t.c.tenant_id == tenant)
                            .group_by(t.c.adapter, t.c.path)).all()
    return {f"{a or MODEL} via {p or 'base'}": n for a, p, n in rows}


def add_arguments(ap) -> None:
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--requests", type=int, default=40, help="per phase")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--port", type=int, default=8000)


def run(a, out) -> None:
    admin = secrets.token_urlsafe(16)
    with tempfile.TemporaryDirectory(prefix="bench-merged-") as tmp:
        state = Path(tmp)
        # The two replicas of the same size: 0.75 CPU each, with the ingress's 0.5 serve run's 2.
        seeded = seeded_config(state, uploads={"pirate": "pirate", "pirate-lora": "pirate"}, dedicated=["pirate"],
                               tenants=("bench",), engine_cpus=0.75, dedicated_cpus=0.75,
                               accounting={"flush_interval_s": 1})
        doc = yaml.safe_load(seeded.config.read_text())
        doc["http_options"]["port"] = a.port
        seeded.config.write_text(yaml.safe_dump(doc))
        with ServeRun(seeded.config, port=a.port, log_path=state / "serve_run.log", admin_token=admin) as run:
            run.wait_ready()
            wait_merged_healthy(run.base_url, admin, seeded.versions["pirate"].id)
            target = Target("loraplex", run.base_url, MODEL, keys=[seeded.keys["bench"]],
                            adapter_models={0: "pirate-lora", 1: "pirate"})
            table = Table(f"merged: concurrency {a.concurrency}, {a.requests} requests per phase, {a.max_tokens} "
                          "output tokens each (ignore_eos, greedy), one serve run",
                          [("path", "path"), ("ok", "requests ok"), ("output_tokens_per_s", "output tok/s", "{:.1f}"),
                           ("vs_base", "vs base", "{:.2f}x"), ("ttft_p50", "TTFT p50 (s)", "{:.3f}"),
                           ("ttft_p95", "TTFT p95 (s)", "{:.3f}"), ("tpot_p50", "TPOT p50 (s)", "{:.4f}")])
            for offset, (name, adapter) in enumerate([("base model", None), ("pirate on the LoRA path", 0),
                                                      ("pirate merged (dedicated replica)", 1)]):
                # Warm up: the adapter loaded, the engine past its first batches.
                asyncio.run(run_closed(target, workload(adapter, a.concurrency, 8, 10_000 * (offset + 5)),
                                       a.concurrency, progress=False))
                results = asyncio.run(run_closed(target, workload(adapter, a.requests, a.max_tokens, 10_000 * offset),
                                                 a.concurrency, desc=name))
                s = summarize(results, a.concurrency)
                table.add(path=name, ok=f"{s['ok']}/{s['requests']}", output_tokens_per_s=s["output_tokens_per_s"],
                          ttft_p50=s["ttft_p50"], ttft_p95=s["ttft_p95"], tpot_p50=s["tpot_p50"])
            time.sleep(3)  # the last records flushed
            billed = paths_billed(seeded.database_url, seeded.owner)
    base, lora, merged = (r["output_tokens_per_s"] for r in table.rows)
    for r in table.rows:
        r["vs_base"] = r["output_tokens_per_s"] / base
    out.table(table)
    out.note(f"merged / base output tok/s: {merged / base:.2f}x (target >= 0.90x: "
             f"{'met' if merged / base >= 0.9 else 'MISSED'}); LoRA / base: {lora / base:.2f}x; "
             f"merged / LoRA: {merged / lora:.2f}x")
    out.note("usage records by adapter and path (warm-up included): " +
             ", ".join(f"{k}: {v}" for k, v in sorted(billed.items())))
