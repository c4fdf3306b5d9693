#!/usr/bin/env python
"""Fair shares between tenants (issue 20): the real `serve run` of serve_config.yaml, fair queue
off and on, side by side in one run; one table per scenario.

    python scripts/bench_fairness.py [--duration 45] [--short 20] [--port 8011] [--out FILE]

Each variant is its own `serve run` of the shipped config (fresh database and spool; pieces in
bench/loadtest/targets.py): `off` (fair_queue.enabled: false), `on` (the shipped fair_queue:
a fixed dispatch_limit 8 on the CPU profile; the run in docs/benchmarks.md was made while it was
adaptive) and, for the goodput table only, `on@max_num_seqs` (dispatch_limit = max_num_seqs).
The config adds one plan, `heavy` (weight 2), for the weights scenario. Prompts are ShareGPT
openings (bench/fairness.py); every request makes exactly max_tokens (ignore_eos).

Scenarios (--duration s each loaded phase, --short s for the light ones alone):
- noisy neighbour: W keeps 48 requests in flight (96 tokens), M sends one 16-token request every
  2 s; M alone, W alone, then both; M's refusals and p50/p95 against M alone, W's output tok/s
  against W alone (same variant);
- priority flood: a priority-0 tenant open loop at 3x capacity (capacity: W alone's requests/s in
  `off`), a priority-100 tenant one 16-token request every 2 s; its refusals and p95 against alone;
- weights: two tenants on plans weighted 2:1, 24 in flight each: served tokens (prompt + 2 x
  completion, the queue's own measure) and their ratio;
- many tenants: 20 tenants, Zipf(1) Poisson demand summing to 2x capacity: Jain's index of
  served output tokens against the max-min fair allocation of what was served in total;
- goodput: one tenant, 16 in flight: output tok/s of requests within the `slo:` TTFT and TPOT
  targets, and raw output tok/s, for off / on@max_num_seqs / on (as shipped);
- the queue's own cost: µs per request of the Engine's queue glue with an instant fake engine.
Requests still running GRACE_S (45 s) after a phase's end are cut (the client goes away) and
count as neither served nor refused; rates divide by the phase's seconds including that grace.
Run it alone on the machine (nothing else using the CPU): ~25 min.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # bench/ sits at the repository root, next to scripts/
sys.path.insert(0, str(ROOT / "platform"))

from bench import fairness as f  # noqa: E402
from bench.loadtest.targets import start_platform  # noqa: E402

MODEL = "SmolLM2-135M-Instruct"


def variant_config(tmp: Path, fair_queue: dict) -> Path:
    doc = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    args = doc["applications"][0]["args"]
    args["engine"]["model"] = str((ROOT / args["engine"]["model"]).resolve())
    args.setdefault("tenancy", {})["plans"] = {"heavy": {"weight": 2.0}}
    queue = dict(args["engine_deployment"].get("fair_queue") or {})
    queue.update(fair_queue)
    args["engine_deployment"]["fair_queue"] = queue
    path = tmp / f"serve_config.{len(list(tmp.iterdir()))}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


async def phase(platform, tenants: list[dict], senders, label: str) -> tuple[list, float, object]:
    """Run senders [(kind, tenant, arg, max_tokens)] together; (results, seconds, target)."""
    target = platform.tenants(tenants)
    prompts = PROMPTS
    out: list = []
    started = time.monotonic()
    until = started + senders[0][4]
    async with f.http_client(platform.base_url) as client:
        tasks = [f.sample_dispatch_limit(client, platform, until, LIMITS.setdefault(label, []))]
        for kind, tenant, arg, max_tokens, _ in senders:
            if kind == "closed":
                tasks.append(f.closed_loop(client, platform, target, tenant, arg, max_tokens, prompts, until, out))
            else:
                tasks.append(f.open_loop(client, platform, target, tenant, arg, max_tokens, prompts, until, out,
                                         poisson=kind == "poisson"))
        await asyncio.gather(*tasks)
    seconds = time.monotonic() - started
    print(f"  {label}: {len(out)} requests in {seconds:.0f} s; dispatch limit seen {LIMITS.get(label)}", flush=True)
    return out, seconds, target


async def run_variant(name: str, platform, args, capacity_rps: float | None) -> dict:
    D, S, T = args.duration, args.short, args.tokens
    r: dict = {}
    # noisy neighbour
    res, secs, _ = await phase(platform, [{"name": "w"}], [("closed", 0, 48, T, D)], "W alone")
    r["w_alone"] = f.tenant_summary(res, 0, secs)
    capacity_rps = capacity_rps or max(r["w_alone"]["ok"], 1) / secs
    res, secs, _ = await phase(platform, [{"name": "m"}], [("even", 0, 0.5, 16, S)], "M alone")
    r["m_alone"] = f.tenant_summary(res, 0, secs)
    res, secs, _ = await phase(platform, [{"name": "w"}, {"name": "m"}],
                               [("closed", 0, 48, T, D), ("even", 1, 0.5, 16, D)], "W + M")
    r["w_noisy"], r["m_noisy"] = f.tenant_summary(res, 0, secs), f.tenant_summary(res, 1, secs)
    # priority flood
    res, secs, _ = await phase(platform, [{"name": "hi", "priority": 100}], [("even", 0, 0.5, 16, S)], "P100 alone")
    r["hi_alone"] = f.tenant_summary(res, 0, secs)
    res, secs, _ = await phase(platform, [{"name": "lo"}, {"name": "hi", "priority": 100}],
                               [("poisson", 0, 3 * capacity_rps, T, D), ("even", 1, 0.5, 16, D)], "flood")
    r["lo_flood"], r["hi_flood"] = f.tenant_summary(res, 0, secs), f.tenant_summary(res, 1, secs)
    # weights 2:1
    res, secs, _ = await phase(platform, [{"name": "heavy", "plan": "heavy"}, {"name": "light"}],
                               [("closed", 0, 24, T, D), ("closed", 1, 24, T, D)], "weights")
    r["heavy"], r["light"] = f.tenant_summary(res, 0, secs), f.tenant_summary(res, 1, secs)
    # 20 Zipf tenants at 2x capacity
    rates = f.zipf_rates(20, 2 * capacity_rps)
    res, secs, _ = await phase(platform, [{"name": f"z{i}"} for i in range(20)],
                               [("poisson", i, rate, T, D) for i, rate in enumerate(rates)], "zipf")
    served = [f.tenant_summary(res, i, secs)["out_tokens"] for i in range(20)]
    demand = [rate * secs * T for rate in rates]
    fair = f.max_min_fair(demand, sum(served))
    r["zipf"] = {"jain": f.jain(served, fair), "served": served, "fair": fair,
                 "refused": sum(f.tenant_summary(res, i, secs)["refused"] for i in range(20))}
    r.update(await goodput_phase(platform, args))
    r["capacity_rps"] = capacity_rps
    r["limits"] = dict(LIMITS)
    LIMITS.clear()
    return r


async def goodput_phase(platform, args) -> dict:
    res, secs, _ = await phase(platform, [{"name": "solo"}], [("closed", 0, 16, args.tokens, args.duration)], "goodput")
    good, raw = f.goodput(res, secs, args.slo_ttft, args.slo_tpot)
    return {"goodput": good, "throughput": raw, "solo": f.tenant_summary(res, 0, secs)}


def fmt(x, spec=".2f") -> str:
    return "-" if x is None else format(x, spec)


def ratio(a, b) -> str:
    return "-" if not a or not b else f"{a / b:.2f}x"


def tables(runs: dict, cost: dict, args) -> str:
    off, on = runs["off"], runs["on"]
    out = []
    def table(title, header, rows):
        out.append(f"\n**{title}**\n")
        out.append("| " + " | ".join(header) + " |")
        out.append("|" + "---|" * len(header))
        out.extend("| " + " | ".join(map(str, row)) + " |" for row in rows)
    rows = []
    for name, r in (("off", off), ("on", on)):
        m, ma, w, wa = r["m_noisy"], r["m_alone"], r["w_noisy"], r["w_alone"]
        rows.append([name, f"{m['ok']}/{m['sent']}", m["refused"], fmt(m["p50"]), fmt(m["p95"]), fmt(ma["p95"]),
                     ratio(m["p95"], ma["p95"]), fmt(w["out_tok_s"], ".1f"), fmt(wa["out_tok_s"], ".1f"),
                     ratio(w["out_tok_s"], wa["out_tok_s"]), w["refused"]])
    table(f"Noisy neighbour (W: 48 in flight x {args.tokens} tokens; M: one 16-token request every 2 s; same plan)",
          ["queue", "M served", "M refused", "M p50 s", "M p95 s", "M alone p95 s", "M p95 / alone",
           "W out tok/s", "W alone tok/s", "W / alone", "W refused"], rows)
    rows = []
    for name, r in (("off", off), ("on", on)):
        h, ha, lo = r["hi_flood"], r["hi_alone"], r["lo_flood"]
        rows.append([name, f"{h['ok']}/{h['sent']}", h["refused"], fmt(h["p95"]), fmt(ha["p95"]),
                     ratio(h["p95"], ha["p95"]), f"{lo['ok']}/{lo['sent']}", lo["refused"],
                     ",".join(f"{k}:{v}" for k, v in sorted(lo["reasons"].items())) or "-"])
    table(f"Priority flood (priority 0 open loop at 3x capacity = {3 * off['capacity_rps']:.2f} req/s x {args.tokens} tokens; "
          "priority 100: one 16-token request every 2 s)",
          ["queue", "P100 served", "P100 refused", "P100 p95 s", "P100 alone p95 s", "p95 / alone",
           "P0 served", "P0 refused", "P0 refusal reasons"], rows)
    rows = []
    for name, r in (("off", off), ("on", on)):
        h, l = r["heavy"], r["light"]
        rows.append([name, h["service"], l["service"], ratio(h["service"], l["service"]), h["out_tokens"],
                     l["out_tokens"], h["refused"], l["refused"]])
    table(f"Weights 2:1 (two tenants, 24 in flight each x {args.tokens} tokens; served = prompt + 2 x completion tokens)",
          ["queue", "heavy (w=2) served", "light (w=1) served", "ratio (target 2.00 ±10%)", "heavy out tok",
           "light out tok", "heavy refused", "light refused"], rows)
    rows = [[name, f"{r['zipf']['jain']:.3f}", r["zipf"]["refused"],
             " ".join(str(s) for s in r["zipf"]["served"][:5]), " ".join(f"{x:.0f}" for x in r["zipf"]["fair"][:5])]
            for name, r in (("off", off), ("on", on))]
    table(f"Many tenants (20, Zipf(1) Poisson demand = 2x capacity, {args.tokens} tokens each)",
          ["queue", "Jain's index vs max-min (target >= 0.95)", "refused", "served out tok, top 5 tenants",
           "max-min share, top 5"], rows)
    rows = []
    for name in ("off", "on@max_num_seqs", "on"):
        r = runs[name]
        rows.append([name, fmt(r["throughput"], ".1f"), ratio(r["throughput"], off["throughput"]),
                     fmt(r["goodput"], ".1f"), ratio(r["goodput"], off["goodput"]),
                     fmt(r["solo"]["ttft_p95"]), r["solo"]["refused"]])
    table(f"One tenant alone (16 in flight x {args.tokens} tokens; goodput: requests with TTFT <= {args.slo_ttft} s and "
          f"TPOT <= {args.slo_tpot} s)",
          ["queue", "throughput out tok/s", "vs off", "goodput out tok/s", "vs off", "TTFT p95 s", "refused"], rows)
    table(f"The queue's own cost (fake instant engine, {cost['requests']} requests, {cost['tenants']} tenants, "
          "24 queued behind 8 running)",
          ["µs/request without queue", "with queue", "queue's own µs/request"],
          [[f"{cost['off_us']:.1f}", f"{cost['on_us']:.1f}", f"{cost['queue_us']:.1f}"]])
    for name in ("off", "on"):
        limits = {k: (min(v), max(v)) for k, v in runs[name].get("limits", {}).items() if v}
        if limits:
            out.append(f"\n{name}: dispatch limit (min, max) per phase, from /admin/replicas: {limits}")
    return "\n".join(out)


PROMPTS = None
LIMITS: dict = {}  # phase -> dispatch limits /admin/replicas showed during it (this variant)


def main() -> int:
    global PROMPTS
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--duration", type=float, default=45.0, help="seconds of each loaded phase")
    p.add_argument("--short", type=float, default=20.0, help="seconds of each light tenant's phase alone")
    p.add_argument("--port", type=int, default=8011)
    p.add_argument("--tokens", type=int, default=96, help="max_tokens of the loaded tenants' requests (M's: 16)")
    p.add_argument("--out", type=Path, help="also write the tables here")
    p.add_argument("--variants", default="off,on,on@max_num_seqs")
    args = p.parse_args()
    shipped = yaml.safe_load((ROOT / "serve_config.yaml").read_text())["applications"][0]["args"]
    args.slo_ttft, args.slo_tpot = shipped["slo"]["ttft_p95_s"], shipped["slo"]["tpot_p95_s"]
    max_num_seqs = shipped["engine"]["max_num_seqs"]
    PROMPTS = f.Prompts()
    cost = asyncio.run(f.queue_cost_us())
    print(f"queue cost: {cost}", flush=True)
    variants = {"off": {"enabled": False}, "on": {"enabled": True},
                "on@max_num_seqs": {"enabled": True, "dispatch_limit": max_num_seqs}}
    runs: dict = {}
    with tempfile.TemporaryDirectory(prefix="bench-fairness-") as tmp:
        tmp = Path(tmp)
        for name in args.variants.split(","):
            print(f"variant {name}: serve run ...", flush=True)
            with start_platform(variant_config(tmp, variants[name]), args.port, tmp) as (base, token):
                platform = f.Platform(base, token, MODEL)
                if name == "on@max_num_seqs":
                    runs[name] = asyncio.run(goodput_phase(platform, args))
                else:
                    runs[name] = asyncio.run(run_variant(name, platform, args, runs.get("off", {}).get("capacity_rps")))
    text = tables(runs, cost, args)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
