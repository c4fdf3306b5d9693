"""Today's adapter placement vs residency-aware placement on 2 real Engine replicas, 8 adapters of
Zipf demand, side by side in one run (issue 22 part 5).

    python -m bench placement [--requests 96] [--concurrency 16] [--adapters 8] [--zipf 1.1]
        [--max-output-tokens 64] [--variants today,residency] [--port 8300]

For each variant, one after the other: `serve run` of the shipped serve_config.yaml with 2 Engine
replicas (0.75 CPU each, the ingress 0.5: the 2 cores; 1 GiB KV cache each; max_loras /
max_cpu_loras / fair queue as shipped) and fresh state, routed by `tenant_affinity` (today) or
`residency_aware` (bench/placement.py). One tenant per adapter, each with its own system prompt
(1,200 characters of ShareGPT text) and the trained demo adapters (bench/demo_adapters.py,
cycled); requests are ShareGPT first questions, each on adapter k with Zipf probability, exactly
--max-output-tokens tokens (ignore_eos, greedy), the same list replayed on both variants in a
closed loop after one warm-up request per adapter. Prints output tok/s, TTFT p50/p95 overall and
per adapter, each tenant's prefix-hit rate (its usage's cached_tokens), where each adapter ran (the
usage ledger's replica ids), and per replica the CPU-tier loads and evictions (the replicas'
Prometheus counters) and slot loads (GET /admin/replicas: adapters vLLM moved into a GPU slot),
warm-up included; then the issue's targets against today's. The merged-vs-LoRA half of the
benchmark is `python -m bench merged`. Run it alone (HEAVY_EXCLUSIVE=1): ~7 min per variant.
"""

from __future__ import annotations

import asyncio
import json
import random
import secrets
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import httpx
import yaml

from bench import placement as pl
from bench.demo_adapters import trained_adapter
from bench.loadtest import targets, workload as wl
from bench.loadtest.runner import run_closed
from bench.loadtest.stats import summarize
from bench.processes import ROOT, marked
from bench.serve_run import ServeRun
from bench.usage import replica_of

DEMO_RECIPES = ("pirate", "banana")


def warm_up(target, w: wl.Workload) -> None:
    """One short request per adapter, one at a time: its first load is not the measured phase's."""
    first = {}
    for r in w.requests:
        first.setdefault(r.adapter, r)
    specs = [wl.RequestSpec(i, s.tenant, s.adapter, s.user_text, 4) for i, s in enumerate(first.values())]
    res = asyncio.run(run_closed(target, wl.Workload(w.tenants, w.adapters, specs, w.source, w.exact_lengths), 1,
                                 progress=False))
    bad = [r for r in res if r["status"] != "ok"]
    if bad:
        raise SystemExit(f"placement: warm-up failed: {bad[0]['status']}: {bad[0]['error']}")


def scrape_counters(run: ServeRun) -> dict[str, dict]:
    """The replicas' adapter counters from their node's metrics agent (this run's Ray node)."""
    from prometheus_client.parser import text_string_to_metric_families

    def cmdlines(pids) -> list[str]:
        out = []
        for pid in pids:
            try:
                out.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
            except OSError:
                pass
        return out

    where = pl.metrics_target(cmdlines(marked(*run.mark)))
    if where is None:
        print("placement: no metrics agent found; loads/evictions not read", file=sys.stderr)
        return {}
    text = httpx.get(f"http://{where}/metrics", timeout=30).text
    return pl.adapter_counters((s.name, dict(s.labels), s.value) for f in text_string_to_metric_families(text)
                               for s in f.samples if s.name.startswith("ray_loraplex_adapter_"))


def run_variant(name: str, a, shipped: dict, model_dir: str, model: str, w: wl.Workload, archives, out: Path) -> dict:
    admin = secrets.token_urlsafe(16)
    with tempfile.TemporaryDirectory(prefix=f"bench-placement-{name}-") as tmp:
        state = Path(tmp)
        doc = pl.placement_config(shipped, policy=pl.VARIANTS[name], state=state, port=a.port, model=model_dir,
                                  engine_cpus=a.engine_cpus)
        cfg = state / "serve_config.yaml"
        cfg.write_text(yaml.safe_dump(doc, sort_keys=False))
        t0 = time.time()
        with ServeRun(cfg, port=a.port, log_path=out / f"serve_run_{name}.log", admin_token=admin) as run:
            run.wait_ready()
            target = targets.platform_target(run.base_url, model, w, admin_token=admin, adapter_archives=archives)
            warm_up(target, w)
            print(f"placement: {name} ready and warm in {time.time() - t0:.0f} s", file=sys.stderr)
            results = asyncio.run(run_closed(target, w, a.concurrency, desc=name, progress=not a.no_progress))
            summary = summarize(results, a.concurrency)
            time.sleep(a.settle_s)  # the replicas' stats and metrics published after the last request
            statuses = httpx.get(f"{run.base_url}/admin/replicas", headers={"Authorization": f"Bearer {admin}"},
                                 timeout=30).json()["data"]
            counters = scrape_counters(run)
            reps = replica_of(doc["applications"][0]["args"]["database_url"], [r["request_id"] for r in results
                                                                               if r["request_id"]])
    (out / f"requests_{name}.json").write_text(json.dumps(results, default=str))
    (out / f"replicas_{name}.json").write_text(json.dumps(statuses, default=str))  # /admin/replicas at the end
    print(f"placement: {name}: {summary['ok']}/{summary['requests']} ok, {summary['output_tokens_per_s']:.1f} "
          f"output tok/s, {time.time() - t0:.0f} s in all", file=sys.stderr)
    return pl.variant_summary(results, summary, reps, counters, statuses)


def add_arguments(ap) -> None:
    ap.add_argument("--requests", type=int, default=96, help="measured requests per variant")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--adapters", type=int, default=8)
    ap.add_argument("--zipf", type=float, default=1.1)
    ap.add_argument("--max-output-tokens", type=int, default=64)
    ap.add_argument("--max-prompt-tokens", type=int, default=512)
    ap.add_argument("--system-chars", type=int, default=1200)
    ap.add_argument("--engine-cpus", type=float, default=0.75)
    ap.add_argument("--variants", default="today,residency", help=f"of {sorted(pl.VARIANTS)}, in this order")
    ap.add_argument("--settle-s", type=float, default=25.0, help="wait after the load for stats and metrics")
    ap.add_argument("--port", type=int, default=8300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-progress", action="store_true")


def run(a, out) -> None:
    names = [n for n in a.variants.split(",") if n]
    if unknown := set(names) - set(pl.VARIANTS):
        raise SystemExit(f"placement: unknown variants {sorted(unknown)}; choose from {sorted(pl.VARIANTS)}")
    shipped = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    eng = targets.engine_config(shipped["applications"][0]["args"], ROOT)
    lengths = wl.Lengths.load(eng.model)
    filler = wl.filler_text()
    system = wl.system_prompts(a.adapters, a.system_chars, filler)
    prompts = wl.sharegpt_prompts(lengths, a.requests, max_prompt_tokens=a.max_prompt_tokens,
                                  max_output_tokens=a.max_output_tokens, max_model_len=eng.max_model_len or 2048,
                                  reserve_tokens=lengths.count(system[0]) + max(lengths.chat_overhead(), 32),
                                  rng=random.Random(a.seed))
    w = pl.zipf_adapter_workload(prompts, adapters=a.adapters, zipf=a.zipf, system=system, seed=a.seed + 1,
                                 source="ShareGPT first questions", exact_lengths=lengths.exact)
    archives = [trained_adapter(r) for r in DEMO_RECIPES]
    out_dir = ROOT / "var" / "bench_placement" / datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.time()
    variants = {n: run_variant(n, a, shipped, eng.model, eng.model_id, w, archives, out_dir) for n in names}
    per = w.describe()["requests_per_tenant"]
    out.note(f"placement: {len(names)} variants, one `serve run` each, 2 Engine replicas x {a.engine_cpus} CPU; "
             f"{a.adapters} adapters (one tenant each), Zipf {a.zipf}: requests per adapter {per}; {a.requests} "
             f"ShareGPT requests, {a.max_output_tokens} output tokens each (ignore_eos, greedy), concurrency "
             f"{a.concurrency}; {time.time() - started:.0f} s")
    for table in pl.tables(variants):
        out.table(table)
    if "today" in variants and "residency" in variants:
        for line in pl.verdict_lines(variants["today"], variants["residency"]):
            out.note(line)
    out.write_json(out_dir / "report.json")
    print(f"placement: results in {out_dir}", file=sys.stderr)
