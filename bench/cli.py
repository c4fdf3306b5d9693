"""`python -m bench SCENARIO [options]` (or `scripts/bench SCENARIO`): every benchmark behind one entry point.

A scenario is a module of bench/scenarios/ with `add_arguments(parser)` and `run(args, out)`; it
starts what it measures through the shared start-ups (bench/serve_run.py: `serve run` of a config;
bench/local_serve.py: Ray Serve in this process; bench/loadtest/targets.py: bare `vllm serve`) and
reports through `out` (bench/report.py): tables printed as markdown, and with `--json PATH` the same
rows written as JSON. Its defaults are the run its section of docs/benchmarks.md shows.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path
from typing import Optional

from bench.report import Output

# name: what it measures (the module bench/scenarios/<name>.py holds the rest).
SCENARIOS = {
    "adapters": "adapter hot-loading: cold vs warm first request, 1,000+ adapters served",
    "admission": "what a tenant-limit check adds to each request",
    "autoscaling": "Serve's autoscaling of the Engine pool: up under a load ramp, down after, no request failed",
    "base_models": "base-model builds (float32, int8, int4) side by side in vLLM: speed, memory, agreement",
    "batch": "a batch beside a rising and falling online load: what it costs the online tenant",
    "cpu_lora_ops": "vLLM's CPU LoRA ops against LoRAPlex's grouped ones, one forward pass",
    "decode_batch": "the engine's decode step against its batch size (vLLM alone)",
    "decode_holds": "simulated: how long the tenant scheduler holds a decode, with and without the bound",
    "drill": "fault drills under load: kill a replica, redeploy; a store down, a disk full, a slow database",
    "fairness": "fair shares between tenants: noisy neighbour, long prompts, flood, weights, goodput",
    "ingress": "the ingress's per-request cost against a bare Ray Serve app",
    "ledger": "what metering adds to each request; append throughput; spool -> database flush",
    "loadtest": "load test, latency-throughput curve and capacity plan (docs/loadtest.md)",
    "merged": "a hot adapter on the LoRA path vs merged on a dedicated replica vs the base model",
    "metrics": "what the loraplex_* metrics cost per request and per token",
    "multi_base": "two base models in one serve run: does load on one slow the other's tenants",
    "overload": "serve run at several times its capacity: shedding, 429/503, memory, no crash",
    "placement": "today's adapter placement vs residency-aware on 2 Engine replicas",
    "route_sim": "routing policies on a simulated multi-tenant trace (no Ray)",
    "routing": "routing policies on real Engine replicas: prefix-cache hits, TTFT, load",
    "slo_classes": "interactive, chat, agent and batch classes on one replica: each within its class, goodput",
    "stream": "streaming through the platform at GPU token rates: tok/s, added TTFT and TPOT",
    "tenant_scheduler": "what the tenant scheduler adds to each engine step, vs vLLM's Scheduler",
}
PROG = "python -m bench"


def usage() -> str:
    width = max(map(len, SCENARIOS))
    return (f"usage: {PROG} SCENARIO [--json PATH] [options]   ({PROG} SCENARIO --help: its options)\n\n"
            "scenarios:\n" + "\n".join(f"  {n:{width}}  {s}" for n, s in SCENARIOS.items()))


def scenario_parser(name: str):
    """(the parser of `name`, its module): the shared options, then the scenario's own."""
    module = importlib.import_module(f"bench.scenarios.{name}")
    p = argparse.ArgumentParser(prog=f"{PROG} {name}", description=module.__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", type=Path, metavar="PATH", help="also write the tables' rows and notes here as JSON")
    module.add_arguments(p)
    return p, module


def main(argv: Optional[list[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "--list"):
        print(usage())
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in SCENARIOS:
        print(f"{PROG}: no scenario {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    parser, module = scenario_parser(name)
    args = parser.parse_args(rest)
    out = Output(name, rest)
    code = module.run(args, out)
    if args.json:
        out.write_json(args.json)
        print(f"{PROG} {name}: rows in {args.json}", file=sys.stderr)
    return code or 0
