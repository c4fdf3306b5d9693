"""SLO classes: three online tenants of three classes and a batch-class tenant on one replica,
the tenant scheduler keeping each class's targets, side by side with the single-SLO scheduler and
vLLM's own scheduler on the same load, in one run.

    python -m bench slo_classes [--duration 60] [--port 8012] [--variants classes,single,vllm] [--load 1]

Each variant is its own `serve run` of serve_config.yaml (its `slo.classes`), tenants made with
their `slo_class` limit: `classes` (tenant_scheduler.slo_classes true), `single` (false, as shipped:
every step sized to the one TPOT target, prefill by counter), `vllm` (fair queue and tenant
scheduler off: vLLM's scheduler behind the platform). Load (ShareGPT openings, ignore_eos):
interactive, one ~200-character request every 2 s, 16 tokens; chat, 4 in flight, ~400
characters, 64 tokens; agent, 2 in flight, 256 tokens; batch, 4 in flight, document prompts
(~4,000 characters), 32 tokens. Then the chat tenant alone, 16 in flight x 64 tokens: its
throughput. Within its class: TTFT and TPOT at most its class's targets (batch: served).
Goodput: output tokens/s of requests within their class's targets.

`--simulate`: no model, no Ray (bench/slo_sim.py): vLLM's Scheduler and the tenant scheduler
(classes on and off) on fake steps at the CPU profile's step costs, a Poisson mix of the four
classes (`--mix longprompt`: a chat tenant beside 1,000-token prompts) at each `--scales` multiple
of its rates and `--costs` step costs; within class, TTFT / TPOT p95 per tenant, goodput.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from pathlib import Path

import yaml

from bench import fairness as f
from bench.loadtest.client import Target
from bench.loadtest.targets import start_platform
from bench.processes import ROOT
from bench.report import Column, Table
from bench.tenants import new_tenant_key

MODEL = "SmolLM2-135M-Instruct"
VARIANTS = {"classes": ({}, {"tenant_scheduler": {"slo_classes": True}}),
            "single": ({}, {"tenant_scheduler": {"slo_classes": False}}),
            "vllm": ({"enabled": False}, {"tenant_scheduler": {"enabled": False}})}
# (tenant, class, kind, arg, max_tokens, prompts): the mixed phase's senders.
MIX = [("interactive", "interactive", "even", 0.5, 16, "short"), ("chat", "chat", "closed", 4, 64, "chat"),
       ("agent", "agent", "closed", 2, 256, "chat"), ("batch", "batch", "closed", 4, 32, "documents")]


def scaled(mix: list, load: float) -> list:
    """The mix at `load` times its rates: each closed loop's in-flight count (at least 1) and the
    even sender's arrival rate."""
    return [(name, c, kind, arg * load if kind == "even" else max(1, round(arg * load)), tokens, texts)
            for name, c, kind, arg, tokens, texts in mix]


def config(tmp: Path, queue: dict, engine: dict) -> Path:
    doc = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    args = doc["applications"][0]["args"]
    args["engine"].update(engine)
    args["engine"]["model"] = str((ROOT / args["engine"]["model"]).resolve())
    args["engine_deployment"]["fair_queue"] = {**(args["engine_deployment"].get("fair_queue") or {}), **queue}
    path = tmp / f"serve_config.{len(list(tmp.iterdir()))}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


async def phase(platform: f.Platform, senders: list, seconds: float, prompts: dict) -> tuple[list, float]:
    target = Target("loraplex", platform.base_url, platform.model)
    run = time.strftime("%H%M%S")
    for name, slo_class, *_ in senders:
        target.keys.append(new_tenant_key(platform.base_url, platform.admin_token, f"slo-{run}-{name}",
                                          {"slo_class": slo_class}))
    out: list = []
    started = time.monotonic()
    until = started + seconds
    async with f.http_client(platform.base_url) as client:
        tasks = []
        for i, (_, _, kind, arg, max_tokens, texts) in enumerate(senders):
            if kind == "closed":
                tasks.append(f.closed_loop(client, platform, target, i, arg, max_tokens, prompts[texts], until, out))
            else:
                tasks.append(f.open_loop(client, platform, target, i, arg, max_tokens, prompts[texts], until, out,
                                         poisson=False))
        await asyncio.gather(*tasks)
    return out, time.monotonic() - started


def summarize(res: list, secs: float, senders: list, classes: dict) -> dict:
    r, good_tokens = {}, 0
    for i, (name, slo_class, *_) in enumerate(senders):
        c = classes[slo_class]
        ttft, tpot = c.get("ttft_p95_s") or float("inf"), c.get("tpot_p95_s") or float("inf")
        good, sent = f.within_slo(res, i, ttft, tpot)
        t = f.tenant_summary(res, i, secs)
        mine_good = [x for x in res if x["tenant"] == i and x["status"] == "ok" and x["ttft"] is not None
                     and x["ttft"] <= ttft and (x["tpot"] or 0) <= tpot]
        good_tokens += sum(x["completion_tokens"] or 0 for x in mine_good)
        r[name] = t | {"good": good, "sent_counted": sent}
        print(f"    {name} ({slo_class}): within {good}/{sent} ttft p95 {t['ttft_p95']} tpot p95 {t['tpot_p95']} "
              f"out tok/s {t['out_tok_s']:.1f} refused {t['refused']}", flush=True)
    r["goodput"] = good_tokens / secs
    r["throughput"] = sum(r[s[0]]["out_tokens"] for s in senders) / secs
    return r


def ratio(a, b) -> str:
    return "-" if not a or not b else f"{a / b:.2f}x"


def add_arguments(p) -> None:
    p.add_argument("--duration", type=float, default=60.0, help="seconds of each phase")
    p.add_argument("--port", type=int, default=8012)
    p.add_argument("--variants", default="classes,single,vllm")
    p.add_argument("--out", type=Path, help="also write the tables to FILE, and what ran to FILE.json")
    p.add_argument("--simulate", action="store_true", help="fake steps on a fake clock instead of a serve run")
    p.add_argument("--scales", default="0.8,1.0,1.2", help="--simulate: multiples of the mix's arrival rates")
    p.add_argument("--mix", default="classes", choices=("classes", "longprompt", "noisy"),
                   help="--simulate: the four classes' tenants, a chat tenant beside 1,000-token prompts, or beside a "
                   "decode-heavy neighbour")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--costs", default="0.06,0.004,0.0015",
                   help="--simulate: a step's seconds as base,per_decode,per_prompt_token (a replica's fit is in its log)")
    p.add_argument("--load", type=float, default=1.0,
                   help="multiple of the mix's in-flight counts and interactive rate (0.5: half of each)")


def simulated(args, out) -> None:
    import dataclasses

    from bench.slo_sim import MIXES, p95, simulate
    loads = MIXES[args.mix]
    costs = tuple(float(x) for x in args.costs.split(","))
    rows = []
    for scale in [float(x) for x in args.scales.split(",")]:
        mix = [dataclasses.replace(load, rate=load.rate * scale) for load in loads]
        runs = {v: simulate(v, mix, args.duration, args.seed, costs) for v in ("classes", "single", "vllm")}
        for name, r in runs.items():
            row = {"scale": f"{scale:g}x", "variant": name}
            for load in loads:
                t = r["tenants"][load.tenant]
                row[load.tenant] = (f"{t['good']}/{t['sent']} ({100 * t['good'] / max(t['sent'], 1):.0f}%) "
                                    f"{p95(t['ttft']) or 0:.2f}/{p95(t['tpot']) or 0:.3f}")
            row["goodput"] = f"{r['goodput']:.1f}"
            row["vs_vllm"] = ratio(r["goodput"], runs["vllm"]["goodput"])
            row["throughput"] = f"{r['throughput']:.1f}"
            row["unreachable"] = ",".join(f"{k}:{v}" for k, v in r["unreachable"].items()) or "-"
            rows.append(row)
    out.table(Table(f"**SLO classes, simulated (fake steps at {costs[0]:g} s + {costs[1] * 1000:g} ms/decode + "
                    f"{costs[2] * 1000:g} ms/prompt token, +-10 %; "
                    f"{args.duration:.0f} s of Poisson arrivals; cell: within class, TTFT p95 s / TPOT p95 s)**",
                    [Column("scale", "load", right=False), Column("variant", "scheduler", right=False)]
                    + [Column(load.tenant, f"{load.tenant} ({load.slo[1] or '-'} / {load.slo[2] or '-'} s)", right=False)
                       for load in loads]
                    + [Column("goodput", "goodput tok/s"), Column("vs_vllm", "vs vllm"), Column("throughput", "out tok/s"),
                       Column("unreachable", "unreachable steps")], rows))


def run(args, out) -> None:
    if args.simulate:
        return simulated(args, out)
    classes = yaml.safe_load((ROOT / "serve_config.yaml").read_text())["applications"][0]["args"]["slo"]["classes"]
    prompts = {"short": f.Prompts(prompt_chars=200), "chat": f.Prompts(), "documents": f.Prompts(4000, documents=True)}
    alone = [("chat", "chat", "closed", 16, 64, "chat")]
    mix_senders = scaled(MIX, args.load)
    runs: dict = {}
    with tempfile.TemporaryDirectory(prefix="bench-slo-") as tmp:
        tmp = Path(tmp)
        for name in args.variants.split(","):
            queue, engine = VARIANTS[name]
            print(f"variant {name}: serve run ...", flush=True)
            with start_platform(config(tmp, queue, engine), args.port, tmp) as (url, token):
                platform = f.Platform(url, token, MODEL)
                res, secs = asyncio.run(phase(platform, mix_senders, args.duration, prompts))
                print(f"  {name} mix: {len(res)} requests in {secs:.0f} s", flush=True)
                mix = summarize(res, secs, mix_senders, classes)
                res, secs = asyncio.run(phase(platform, alone, args.duration / 2, prompts))
                print(f"  {name} chat alone: {len(res)} requests in {secs:.0f} s", flush=True)
                runs[name] = {"mix": mix, "alone": summarize(res, secs, alone, classes)}
            if args.out:
                args.out.with_suffix(".json").write_text(json.dumps(runs, default=str))
    base = runs.get("vllm", {})
    rows = []
    for name, r in runs.items():
        m = r["mix"]
        row = {"variant": name}
        for tenant, slo_class, *_ in MIX:
            t = m[tenant]
            row[tenant] = f"{t['good']}/{t['sent_counted']}" + (
                f" ({100 * t['good'] / t['sent_counted']:.0f}%)" if t["sent_counted"] else "")
        row["goodput"] = f"{m['goodput']:.1f}"
        row["vs_vllm"] = ratio(m["goodput"], base.get("mix", {}).get("goodput"))
        row["throughput"] = f"{m['throughput']:.1f}"
        row["alone"] = f"{r['alone']['throughput']:.1f}"
        row["alone_vs"] = ratio(r["alone"]["throughput"], base.get("alone", {}).get("throughput"))
        rows.append(row)
    table = Table(f"**SLO classes: one replica, four tenants at {args.load:g}x the mix (within their class's targets; "
                  "goodput out tok/s)**",
                  [Column("variant", "scheduler", right=False)]
                  + [Column(t, f"{t} within ({c})", right=False) for t, c, *_ in MIX]
                  + [Column("goodput", "goodput tok/s"), Column("vs_vllm", "vs vllm"),
                     Column("throughput", "out tok/s"), Column("alone", "chat alone tok/s"),
                     Column("alone_vs", "alone vs vllm")], rows)
    out.table(table)
    if args.out:
        args.out.write_text(f"{table.title}\n\n{table.markdown()}\n")
