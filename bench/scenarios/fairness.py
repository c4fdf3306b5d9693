"""Fair shares between tenants (issue 20): the real `serve run` of serve_config.yaml, fair queue
off and on, side by side in one run; one table per scenario.

    python -m bench fairness [--duration 45] [--short 20] [--port 8011] [--out FILE]

Each variant is its own `serve run` of the shipped config (fresh database and spool; pieces in
bench/loadtest/targets.py): `off` (fair_queue.enabled: false), `on` (the shipped fair_queue),
`on@max_num_seqs` (dispatch_limit = max_num_seqs; the goodput table only), `on@N` (dispatch_limit
N, or `adaptive`: unset; the noisy-neighbour and priority-flood scenarios only); a variant may add
`+paceK` (max_prefilling_per_tenant K, 0 for none), `+tokK` (the engine's
max_num_batched_tokens K) and `+mp0`/`+mp1` (VLLM_ENABLE_V1_MULTIPROCESSING, the app's runtime_env).
--goodput-only: every variant the goodput scenario only.
With --out, what ran is also written to FILE.json after each variant.
The config adds one plan, `heavy` (weight 2), for the weights scenario. Prompts are ShareGPT
openings (bench/fairness.py); every request makes exactly max_tokens (ignore_eos).

Scenarios (--duration s each loaded phase, --short s for the light ones alone):
- noisy neighbour: W keeps 48 requests in flight (96 tokens), M sends one 16-token request every
  2 s; M alone, W alone, then both; M's refusals and p50/p95 against M alone, W's output tok/s
  against W alone (same variant);
- priority flood: a priority-0 tenant open loop at 3x capacity (capacity: W alone's requests/s in
  `off`), a priority-100 tenant one 16-token request every 2 s; its refusals and p95 against alone;
- weights: two tenants on plans weighted 2:1, 24 in flight each: served tokens (weighted by the
  shipped fair_queue's prompt / completion token costs, the queue's own measure) streamed while
  requests arrived (the drain after it, when one tenant's queue empties first, left out) and their ratio;
- many tenants: 20 tenants, Zipf(1) Poisson demand summing to 2x capacity: Jain's index of
  served output tokens against the max-min fair allocation of what was served in total, each
  tenant's demand being the output tokens of the requests it sent;
- goodput: one tenant, 16 in flight: output tok/s of requests within the `slo:` TTFT and TPOT
  targets, and raw output tok/s, for off / on@max_num_seqs / on (as shipped);
- the queue's own cost: µs per request of the Engine's queue glue with an instant fake engine.
Requests still running GRACE_S (45 s) after a phase's end are cut (the client goes away) and
count as neither served nor refused; rates divide by the phase's seconds including that grace.
Run it alone on the machine (nothing else using the CPU): ~25 min.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from pathlib import Path

import yaml

from bench import fairness as f
from bench.loadtest.targets import start_platform
from bench.processes import ROOT
from bench.report import Column, Table

MODEL = "SmolLM2-135M-Instruct"
# The fair queue as it shipped before the tenant scheduler (main 21347ba), vLLM's own scheduler beside it.
OLD_QUEUE = {"enabled": True, "dispatch_limit": 8, "newcomer_slots": 2, "max_queued": 24, "aging_s": 10,
             "prompt_token_cost": 0.1, "max_prefilling_per_tenant": 1}


def variant_config(tmp: Path, fair_queue: dict, engine: dict | None = None, env: dict | None = None) -> Path:
    doc = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    if env:  # the app's runtime_env: every replica of it, and the vLLM processes they start
        doc["applications"][0].setdefault("runtime_env", {}).setdefault("env_vars", {}).update(env)
    args = doc["applications"][0]["args"]
    args["engine"].update(engine or {})
    args["engine"]["model"] = str((ROOT / args["engine"]["model"]).resolve())
    args.setdefault("tenancy", {})["plans"] = {"heavy": {"weight": 2.0}}
    queue = dict(args["engine_deployment"].get("fair_queue") or {})
    queue.update(fair_queue)
    args["engine_deployment"]["fair_queue"] = queue
    path = tmp / f"serve_config.{len(list(tmp.iterdir()))}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


async def phase(platform, tenants: list[dict], senders, label: str) -> tuple[list, float, float]:
    """Run senders [(kind, tenant, arg, max_tokens, seconds)] together; (results, seconds
    including the drain, epoch of the arrivals' end)."""
    target = platform.tenants(tenants)
    out: list = []
    started = time.monotonic()
    until = started + senders[0][4]
    until_epoch = time.time() + senders[0][4]
    async with f.http_client(platform.base_url) as client:
        tasks = [f.sample_dispatch_limit(client, platform, until, LIMITS.setdefault(label, []))]
        for kind, tenant, arg, max_tokens, _, *own in senders:
            prompts = own[0] if own else PROMPTS  # a sender's own prompts (the long-prompt tenant's documents)
            if kind == "closed":
                tasks.append(f.closed_loop(client, platform, target, tenant, arg, max_tokens, prompts, until, out))
            else:
                tasks.append(f.open_loop(client, platform, target, tenant, arg, max_tokens, prompts, until, out,
                                         poisson=kind == "poisson"))
        await asyncio.gather(*tasks)
    seconds = time.monotonic() - started
    print(f"  {label}: {len(out)} requests in {seconds:.0f} s; dispatch limit seen {LIMITS.get(label)}", flush=True)
    for i in range(len(tenants)):
        t = f.tenant_summary(out, i, seconds, until_epoch)
        good, sent = f.within_slo(out, i, SLO[0], SLO[1])
        print(f"    {tenants[i]['name']}: sent {t['sent']} ok {t['ok']} refused {t['refused']} {t['reasons']} "
              f"cut {t['cut']} failed {t['failed']} p50 {fmt(t['p50'])} p95 {fmt(t['p95'])} "
              f"ttft p95 {fmt(t['ttft_p95'])} tpot p95 {fmt(t['tpot_p95'], '.3f')} within SLO {good}/{sent} "
              f"out tok/s {t['out_tok_s']:.1f} window service {t['window_service'] or 0:.0f}", flush=True)
    return out, seconds, until_epoch


def slo(res: list, tenant: int) -> dict:
    good, sent = f.within_slo(res, tenant, *SLO)
    return {"slo_good": good, "slo_sent": sent}


async def run_variant(name: str, platform, args, capacity_rps: float | None, latency_only: bool = False) -> dict:
    D, S, T = args.duration, args.short, args.tokens
    r: dict = {}
    if "longprompt" in args.scenarios:
        # long-prompt neighbour: L keeps 16 document-length prompts in flight (8 output tokens), C
        # sends one 16-token request every 2 s
        res, secs, until = await phase(platform, [{"name": "l"}], [("closed", 0, 16, 8, D, DOCUMENTS)], "L alone")
        r["l_alone"] = f.tenant_summary(res, 0, secs, until)
        res, secs, _ = await phase(platform, [{"name": "c"}], [("even", 0, 0.5, 16, S)], "C alone")
        r["c_alone"] = f.tenant_summary(res, 0, secs) | slo(res, 0)
        res, secs, until = await phase(platform, [{"name": "l"}, {"name": "c"}],
                                       [("closed", 0, 16, 8, D, DOCUMENTS), ("even", 1, 0.5, 16, D)], "L + C")
        r["l_long"], r["c_long"] = f.tenant_summary(res, 0, secs, until), f.tenant_summary(res, 1, secs, until) | slo(res, 1)
    if "noisy" in args.scenarios or "flood" in args.scenarios:
        # decode-heavy neighbour (W alone also sizes the flood's capacity)
        res, secs, until = await phase(platform, [{"name": "w"}], [("closed", 0, 48, T, D)], "W alone")
        r["w_alone"] = f.tenant_summary(res, 0, secs, until)
        capacity_rps = capacity_rps or max(r["w_alone"]["ok"], 1) / secs
    if "noisy" in args.scenarios:
        res, secs, _ = await phase(platform, [{"name": "m"}], [("even", 0, 0.5, 16, S)], "M alone")
        r["m_alone"] = f.tenant_summary(res, 0, secs) | slo(res, 0)
        res, secs, until = await phase(platform, [{"name": "w"}, {"name": "m"}],
                                       [("closed", 0, 48, T, D), ("even", 1, 0.5, 16, D)], "W + M")
        r["w_noisy"], r["m_noisy"] = f.tenant_summary(res, 0, secs, until), f.tenant_summary(res, 1, secs, until) | slo(res, 1)
    if "flood" not in args.scenarios:
        r["capacity_rps"], r["limits"] = capacity_rps, dict(LIMITS)
        LIMITS.clear()
        return r if latency_only or "weights" not in args.scenarios else r | await weights_zipf_goodput(platform, args, capacity_rps or 1.0)
    # priority flood
    res, secs, _ = await phase(platform, [{"name": "hi", "priority": 100}], [("even", 0, 0.5, 16, S)], "P100 alone")
    r["hi_alone"] = f.tenant_summary(res, 0, secs) | slo(res, 0)
    res, secs, _ = await phase(platform, [{"name": "lo"}, {"name": "hi", "priority": 100}],
                               [("poisson", 0, 3 * capacity_rps, T, D), ("even", 1, 0.5, 16, D)], "flood")
    r["lo_flood"], r["hi_flood"] = f.tenant_summary(res, 0, secs), f.tenant_summary(res, 1, secs) | slo(res, 1)
    if latency_only or "weights" not in args.scenarios:  # a dispatch-limit variant: the latency scenarios only
        r["capacity_rps"], r["limits"] = capacity_rps, dict(LIMITS)
        LIMITS.clear()
        return r
    return r | await weights_zipf_goodput(platform, args, capacity_rps)


async def weights_zipf_goodput(platform, args, capacity_rps: float) -> dict:
    D, T = args.duration, args.tokens
    r: dict = {}
    # weights 2:1
    res, secs, until = await phase(platform, [{"name": "heavy", "plan": "heavy"}, {"name": "light"}],
                                   [("closed", 0, 24, T, D), ("closed", 1, 24, T, D)], "weights")
    costs = args.token_costs
    r["heavy"], r["light"] = (f.tenant_summary(res, 0, secs, until, costs), f.tenant_summary(res, 1, secs, until, costs))
    # 20 Zipf tenants at 2x capacity
    rates = f.zipf_rates(20, 2 * capacity_rps)
    res, secs, _ = await phase(platform, [{"name": f"z{i}"} for i in range(20)],
                               [("poisson", i, rate, T, D) for i, rate in enumerate(rates)], "zipf")
    summaries = [f.tenant_summary(res, i, secs) for i in range(20)]
    served = [t["out_tokens"] for t in summaries]
    # Demand: the output tokens each tenant asked for (its Poisson arrivals in the phase), not
    # rate x the phase's seconds (those include the drain, when nothing arrives).
    demand = [t["sent"] * T for t in summaries]
    fair = f.max_min_fair(demand, sum(served))
    reasons: dict = {}
    for t in summaries:
        for k, v in t["reasons"].items():
            reasons[k] = reasons.get(k, 0) + v
    r["zipf"] = {"jain": f.jain(served, fair), "served": served, "fair": fair, "demand": demand,
                 "refused": sum(t["refused"] for t in summaries), "reasons": reasons,
                 "refused_by_tenant": [t["refused"] for t in summaries]}
    if "goodput" in args.scenarios:
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


def within(t: dict) -> str:
    return "-" if not t.get("slo_sent") else f"{t['slo_good']}/{t['slo_sent']} ({100 * t['slo_good'] / t['slo_sent']:.0f}%)"


def reasons(t: dict) -> str:
    return ",".join(f"{k}:{v}" for k, v in sorted(t["reasons"].items())) or "-"


def tables(runs: dict, cost: dict, args) -> tuple[list[Table], list[str]]:
    """The tables of what ran (cells as printed), and the dispatch limits seen."""
    off = runs.get("off", {})  # absent when only on@N variants ran
    full = [n for n in runs if "m_noisy" in runs[n]]  # the variants that ran the decode-heavy neighbour
    out, notes = [], []

    def table(title, header, rows):
        keys = [h if header.count(h) == 1 else f"{h} ({i})" for i, h in enumerate(header)]
        out.append(Table(f"**{title}**", [Column(k, h, right=False) for k, h in zip(keys, header)],
                         [dict(zip(keys, row)) for row in rows]))
    rows = []
    for name in [n for n in runs if "c_long" in runs[n]]:
        r = runs[name]
        c, ca, l, la = r["c_long"], r["c_alone"], r["l_long"], r["l_alone"]
        D = args.duration
        l_s, la_s = l["window_prompt_tokens"] / D, la["window_prompt_tokens"] / D
        rows.append([name, f"{c['ok']}/{c['sent']}", c["refused"], within(c), within(ca), fmt(c["ttft_p95"]),
                     fmt(c["tpot_p95"], ".3f"), fmt(c["p95"]), fmt(ca["p95"]), ratio(c["p95"], ca["p95"]),
                     fmt(l_s, ".0f"), fmt(la_s, ".0f"), ratio(l_s, la_s), l["refused"]])
    table(f"Long-prompt neighbour (L: 16 in flight x document prompts of ~{args.doc_chars // 4} tokens, 8 output "
          f"tokens; C: one 16-token request every 2 s; within SLO: TTFT <= {SLO[0]} s and TPOT <= {SLO[1]} s)",
          ["scheduler", "C served", "C refused", "C within SLO (target >= 95%)", "C alone within SLO", "C TTFT p95 s",
           "C TPOT p95 s", "C p95 s", "C alone p95 s", "C p95 / alone", "L prompt tok/s", "L alone prompt tok/s",
           "L / alone (target >= 0.8x)", "L refused"], rows)
    rows = []
    for name in full:
        r = runs[name]
        m, ma, w, wa = r["m_noisy"], r["m_alone"], r["w_noisy"], r["w_alone"]
        D = args.duration  # tok/s: completion tokens streamed during the D s of arrivals (steady state)
        w_s, wa_s, m_s = w["window_out_tokens"] / D, wa["window_out_tokens"] / D, m["window_out_tokens"] / D
        rows.append([name, f"{m['ok']}/{m['sent']}", m["refused"], reasons(m), within(m), within(ma), fmt(m["p50"]), fmt(m["p95"]),
                     fmt(ma["p95"]), ratio(m["p95"], ma["p95"]), fmt(w_s, ".1f"), fmt(wa_s, ".1f"),
                     ratio(w_s, wa_s), fmt(m_s, ".1f"), ratio(w_s + m_s, wa_s), w["refused"]])
    table(f"Noisy neighbour (W: 48 in flight x {args.tokens} tokens; M: one 16-token request every 2 s; same plan)",
          ["queue", "M served", "M refused", "M refusal reasons", "M within SLO (target >= 95%)", "M alone within SLO",
           "M p50 s", "M p95 s", "M alone p95 s",
           "M p95 / alone", "W out tok/s", "W alone tok/s", "W / alone", "M out tok/s", "(W + M) / W alone",
           "W refused"], rows)
    rows = []
    for name in [n for n in runs if "hi_flood" in runs[n]]:
        r = runs[name]
        h, ha, lo = r["hi_flood"], r["hi_alone"], r["lo_flood"]
        rows.append([name, f"{3 * r['capacity_rps']:.2f}", f"{h['ok']}/{h['sent']}", h["refused"], reasons(h),
                     within(h), within(ha),
                     fmt(h["p95"]), fmt(ha["p95"]), ratio(h["p95"], ha["p95"]), f"{lo['ok']}/{lo['sent']}",
                     lo["refused"], reasons(lo)])
    table(f"Priority flood (priority 0 open loop at 3x capacity x {args.tokens} tokens, capacity = W alone's requests/s "
          "in `off`, or in the variant itself when `off` did not run; priority 100: one 16-token request every 2 s)",
          ["queue", "P0 offered req/s", "P100 served", "P100 refused", "P100 refusal reasons",
           "P100 within SLO (target >= 95%)", "P100 alone within SLO", "P100 p95 s", "P100 alone p95 s",
           "p95 / alone", "P0 served", "P0 refused", "P0 refusal reasons"], rows)
    rows = []
    for name in runs:
        r = runs[name]
        if "heavy" not in r:
            continue
        h, l = r["heavy"], r["light"]
        rows.append([name, f"{h['window_service']:.0f}", f"{l['window_service']:.0f}",
                     ratio(h["window_service"], l["window_service"]), f"{h['service']:.0f}", f"{l['service']:.0f}",
                     ratio(h["service"], l["service"]), f"{h['refused']} {reasons(h)}", f"{l['refused']} {reasons(l)}"])
    table(f"Weights 2:1 (two tenants, 24 in flight each x {args.tokens} tokens; served = "
          f"{args.token_costs[0]:g} x prompt + {args.token_costs[1]:g} x completion tokens (the shipped fair_queue costs), in the {args.duration:.0f} s of arrivals; with the drain after it for reference)",
          ["queue", "heavy (w=2) served", "light (w=1) served", "ratio (target 2.00 ±10%)",
           "heavy incl. drain", "light incl. drain", "ratio incl. drain", "heavy refused", "light refused"], rows)
    rows = [[name, f"{runs[name]['zipf']['jain']:.3f}", runs[name]["zipf"]["refused"],
             ",".join(f"{k}:{v}" for k, v in sorted(runs[name]["zipf"].get("reasons", {}).items())) or "-",
             " ".join(str(s) for s in runs[name]["zipf"]["served"][:5]),
             " ".join(f"{x:.0f}" for x in runs[name]["zipf"]["fair"][:5]),
             " ".join(f"{x:.0f}" for x in runs[name]["zipf"].get("demand", [])[:5])]
            for name in runs if "zipf" in runs[name]]
    table(f"Many tenants (20, Zipf(1) Poisson demand = 2x capacity, {args.tokens} tokens each)",
          ["queue", "Jain's index vs max-min (target >= 0.95)", "refused", "refusal reasons",
           "served out tok, top 5 tenants", "max-min share, top 5", "demand, top 5"], rows)
    rows = []
    for name in [n for n in runs if "goodput" in runs[n]]:
        r = runs[name]
        rows.append([name, fmt(r["throughput"], ".1f"), ratio(r["throughput"], off.get("throughput")),
                     fmt(r["goodput"], ".1f"), ratio(r["goodput"], off.get("goodput")),
                     fmt(r["solo"]["ttft_p95"]), r["solo"]["refused"]])
    table(f"One tenant alone (16 in flight x {args.tokens} tokens; goodput: requests with TTFT <= {args.slo_ttft} s and "
          f"TPOT <= {args.slo_tpot} s)",
          ["queue", "throughput out tok/s", "vs off", "goodput out tok/s", "vs off", "TTFT p95 s", "refused"], rows)
    table(f"The queue's own cost (fake instant engine, {cost['requests']} requests, {cost['tenants']} tenants, "
          "24 queued behind 8 running)",
          ["µs/request without queue", "with queue", "queue's own µs/request"],
          [[f"{cost['off_us']:.1f}", f"{cost['on_us']:.1f}", f"{cost['queue_us']:.1f}"]])
    for name in runs:
        limits = {k: (min(v), max(v)) for k, v in runs[name].get("limits", {}).items() if v}
        if limits:
            notes.append(f"{name}: dispatch limit (min, max) per phase, from /admin/replicas: {limits}")
    return out, notes


PROMPTS = DOCUMENTS = None
SLO: list = [2.5, 0.3]  # the shipped `slo:` TTFT and TPOT targets (set in main)
LIMITS: dict = {}  # phase -> dispatch limits /admin/replicas showed during it (this variant)


def add_arguments(p) -> None:
    p.add_argument("--duration", type=float, default=45.0, help="seconds of each loaded phase")
    p.add_argument("--short", type=float, default=20.0, help="seconds of each light tenant's phase alone")
    p.add_argument("--port", type=int, default=8011)
    p.add_argument("--tokens", type=int, default=96, help="max_tokens of the loaded tenants' requests (M's: 16)")
    p.add_argument("--out", type=Path, help="also write the tables to FILE, and what ran to FILE.json after each variant")
    p.add_argument("--variants", default="off,on,on@max_num_seqs")
    p.add_argument("--scenarios", default="longprompt,noisy,flood,weights,zipf,goodput",
                   help="which scenarios each full variant runs (comma list; weights includes zipf and goodput)")
    p.add_argument("--doc-chars", type=int, default=4000, help="the long-prompt tenant's prompt length, characters")
    p.add_argument("--goodput-only", action="store_true",
                   help="each variant runs the one-tenant goodput scenario only (~3 min a variant)")


def run(args, out) -> None:
    global PROMPTS, DOCUMENTS
    shipped = yaml.safe_load((ROOT / "serve_config.yaml").read_text())["applications"][0]["args"]
    args.slo_ttft, args.slo_tpot = shipped["slo"]["ttft_p95_s"], shipped["slo"]["tpot_p95_s"]
    SLO[:] = [args.slo_ttft, args.slo_tpot]
    args.scenarios = set(args.scenarios.split(","))
    max_num_seqs = shipped["engine"]["max_num_seqs"]
    queue = shipped["engine_deployment"].get("fair_queue") or {}
    args.token_costs = (queue.get("prompt_token_cost", 1.0), queue.get("completion_token_cost", 2.0))
    PROMPTS = f.Prompts()
    DOCUMENTS = f.Prompts(prompt_chars=args.doc_chars, documents=True)
    cost = asyncio.run(f.queue_cost_us())
    print(f"queue cost: {cost}", flush=True)
    variants = {"off": ({"enabled": False}, {"tenant_scheduler": {"enabled": False}}), "on": ({"enabled": True}, {}),
                "old": (OLD_QUEUE, {"tenant_scheduler": {"enabled": False}}),
                "on@max_num_seqs": ({"enabled": True, "dispatch_limit": max_num_seqs}, {})}
    runs: dict = {}
    with tempfile.TemporaryDirectory(prefix="bench-fairness-") as tmp:
        tmp = Path(tmp)
        for name in args.variants.split(","):
            base, queue, engine, env = f.parse_variant(name, variants)
            print(f"variant {name}: serve run ... ({queue}, engine {engine})", flush=True)
            with start_platform(variant_config(tmp, queue, engine, env), args.port, tmp) as (url, token):
                platform = f.Platform(url, token, MODEL)
                capacity = runs.get("off", {}).get("capacity_rps")
                if base == "on@max_num_seqs" or args.goodput_only:
                    runs[name] = asyncio.run(goodput_phase(platform, args)) | {"limits": dict(LIMITS)}
                    LIMITS.clear()
                else:
                    runs[name] = asyncio.run(run_variant(name, platform, args, capacity,
                                                         latency_only=base not in variants))
            if args.out:  # what ran so far, should a later variant not finish
                args.out.with_suffix(".json").write_text(json.dumps({"runs": runs, "cost": cost}, default=str))
    tables_, notes = tables(runs, cost, args)
    for table in tables_:
        out.table(table)
    for note in notes:
        out.note(note)
    if args.out:
        args.out.write_text("\n\n".join(f"{t.title}\n\n{t.markdown()}" for t in tables_) + "\n\n" + "\n".join(notes) + "\n")
