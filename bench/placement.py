"""Today's adapter placement vs residency-aware placement on real Engine replicas: the pieces of
python -m bench placement that are plain data (config, workload, figures, tables), unit-tested.

"today" is the shipped router (`engine_deployment.routing.policy: tenant_affinity`), "residency"
the opt-in one (`residency_aware`, loraplex/routing/residency.py). Every adapter belongs to its own
tenant (its own system prompt), so a tenant's prefix-hit rate is its adapter's.
"""

from __future__ import annotations

import copy
import re
from collections import Counter
from pathlib import Path
from typing import Iterable, Optional

from bench.loadtest import workload as wl
from bench.percentile import or_nan, percentile
from bench.report import Table
from bench.state import with_fresh_state

VARIANTS = {"today": "tenant_affinity", "residency": "residency_aware"}
TARGETS = {"ttft_p50": 0.5, "output_tok_s": 1.3, "hit_points": 5.0}  # issue 22's done-when


def placement_config(shipped: dict, *, policy: str, state: Path, port: int, model: str, replicas: int = 2,
                     engine_cpus: float = 0.75, ingress_cpus: float = 0.5, kv_cache_bytes: int = 1 << 30) -> dict:
    """The shipped serve config with `replicas` Engine replicas routed by `policy`, its state in
    `state`, on `port`. Fractional CPUs so that every replica fits on the node (2 x 0.75 + the
    ingress's 0.5 = 2 cores); each engine's KV cache `kv_cache_bytes` (~2.5 GB per engine with
    the model and vLLM), not the shipped share of host RAM, so that two fit beside other work.
    Everything else (max_loras, max_cpu_loras, fair queue, ...) as shipped."""
    doc = copy.deepcopy(shipped)
    doc["http_options"]["port"] = port
    app = next(a for a in doc["applications"] if str(a.get("import_path", "")).startswith("loraplex.app"))
    args = app["args"]
    with_fresh_state(args, state, flush_interval_s=0.5)
    args["engine"]["model"] = model
    args["engine"]["engine_kwargs"] = {**(args["engine"].get("engine_kwargs") or {}),
                                       "kv_cache_memory_bytes": int(kv_cache_bytes)}
    dep = args["engine_deployment"]
    dep["num_cpus"] = engine_cpus
    dep["routing"] = {**(dep.get("routing") or {}), "policy": policy}
    args["ingress"]["num_cpus"] = ingress_cpus
    for d in app.setdefault("deployments", []):
        if d.get("name") == "Engine":
            d["num_replicas"] = replicas
    if not any(d.get("name") == "Engine" for d in app["deployments"]):
        app["deployments"].append({"name": "Engine", "num_replicas": replicas})
    return doc


def zipf_adapter_workload(prompts: list[wl.Prompt], *, adapters: int, zipf: float, system: list[str], seed: int,
                          source: str, exact_lengths: bool, ignore_eos: bool = True) -> wl.Workload:
    """Every request on one of `adapters` adapters, adapter k (k = 0 the hottest) with Zipf
    probability ~ 1/(k+1)^zipf; adapter k is tenant k's only one (tenant k's system prompt)."""
    import random

    return wl.build_workload(prompts, tenants=adapters, zipf_s=zipf, adapter_share=[1.0], adapters_per_tenant=1,
                             system=system, rng=random.Random(seed), source=source, exact_lengths=exact_lengths,
                             ignore_eos=ignore_eos)


def _ok(results: Iterable[dict]) -> list[dict]:
    return [r for r in results if r["status"] == "ok"]


def hit_rate(results: Iterable[dict]) -> Optional[float]:
    """Prompt tokens served from the prefix cache / prompt tokens (the usage's cached_tokens)."""
    ok = _ok(results)
    prompt = sum(r["prompt_tokens"] or 0 for r in ok)
    return sum(r["cached_prompt_tokens"] or 0 for r in ok) / prompt if prompt else None


def per_adapter(results: list[dict]) -> dict[int, dict]:
    """Per adapter index: requests ok, TTFT p50/p95 and its tenant's prefix-hit rate."""
    out = {}
    for a in sorted({r["adapter"] for r in results if r["adapter"] is not None}):
        mine = [r for r in results if r["adapter"] == a]
        ok = _ok(mine)
        out[a] = {"requests": len(mine), "ok": len(ok), "ttft_p50": percentile([r["ttft"] for r in ok], 50),
                  "ttft_p95": percentile([r["ttft"] for r in ok], 95), "hit": hit_rate(mine)}
    return out


def placement(results: list[dict], replica_of: dict[str, str]) -> dict[str, Counter]:
    """Per replica: how many requests of each adapter it served (the ledger's replica ids)."""
    out: dict[str, Counter] = {}
    for r in _ok(results):
        rep = replica_of.get(r["request_id"] or "")
        if rep is not None:
            out.setdefault(rep, Counter())[r["adapter"]] += 1
    return out


SESSION_DIR = re.compile(r"--session[-_]dir=(\S+)")
NODE_IP = re.compile(r"--node-ip-address=(\S+)")


def metrics_target(cmdlines: Iterable[str]) -> Optional[str]:
    """host:port of the Ray node's metrics agent, from its processes' command lines (the raylet's
    session dir, where the agent writes the port it picked: metrics_export_port_<node id>)."""
    session = host = None
    for line in cmdlines:
        session = session or (m.group(1) if (m := SESSION_DIR.search(line)) else None)
        host = host or (m.group(1) if (m := NODE_IP.search(line)) else None)
    if session is None:
        return None
    for f in sorted(Path(session).glob("metrics_export_port_*")):
        port = f.read_text().strip()
        if port.isdigit() and int(port) > 0:
            return f"{host or '127.0.0.1'}:{port}"
    return None


def adapter_counters(samples: Iterable[tuple[str, dict, float]]) -> dict[str, dict]:
    """Per replica label: CPU-tier loads and evictions (lru + bytes: made room; not `deleted`),
    from (name, labels, value) samples of the replicas' Prometheus metrics."""
    out: dict[str, dict] = {}
    for name, labels, value in samples:
        rep = labels.get("replica")
        if rep is None:
            continue
        c = out.setdefault(rep, {"loads": 0, "evictions": 0})
        if name == "ray_loraplex_adapter_loads_total":
            c["loads"] += int(value)
        elif name == "ray_loraplex_adapter_evictions_total" and labels.get("reason") in ("lru", "bytes"):
            c["evictions"] += int(value)
    return out


def variant_summary(results: list[dict], summary: dict, replica_of: dict[str, str], counters: dict[str, dict],
                    statuses: list[dict]) -> dict:
    """One variant's figures: the load test's summary, per adapter, placement and replica counters."""
    slot_loads = {s["replica_id"]: int(s.get("slot_loads") or 0) for s in statuses}
    reps = sorted(set(slot_loads) | set(counters) | set(replica_of.values()))
    return {"summary": summary, "adapters": per_adapter(results), "hit": hit_rate(results),
            "placement": placement(results, replica_of),
            "replicas": {r: {**counters.get(r, {"loads": 0, "evictions": 0}), "slot_loads": slot_loads.get(r, 0)}
                         for r in reps}}


def _f(x, fmt="{:.2f}") -> str:
    return "-" if x is None or x != x else fmt.format(x)


def _ratio(new, old) -> Optional[float]:
    return None if new is None or not old else new / old


def verdict(today: dict, new: dict) -> dict:
    """The done-when checks: TTFT p50 <= 0.5x, output tok/s >= 1.3x, no tenant's hit rate more
    than 5 points below today's."""
    ttft = _ratio(new["summary"]["ttft_p50"], today["summary"]["ttft_p50"])
    tok = _ratio(new["summary"]["output_tokens_per_s"], today["summary"]["output_tokens_per_s"])
    drops = {a: 100 * (or_nan(new["adapters"].get(a, {}).get("hit")) - or_nan(s["hit"]))
             for a, s in today["adapters"].items()}
    worst = min((d for d in drops.values() if d == d), default=None)
    return {"ttft_p50_ratio": ttft, "ttft_met": ttft is not None and ttft <= TARGETS["ttft_p50"],
            "tok_ratio": tok, "tok_met": tok is not None and tok >= TARGETS["output_tok_s"],
            "worst_hit_points": worst, "hit_met": worst is not None and worst >= -TARGETS["hit_points"]}


def tables(variants: dict[str, dict]) -> list[Table]:
    """The variants side by side, per adapter, and where each adapter ran."""
    side = Table("", [("placement", "placement"), ("ok", "requests ok"), ("output_tok_s", "output tok/s", "{:.1f}"),
                      ("ttft_p50", "TTFT p50 s", "{:.2f}"), ("ttft_p95", "TTFT p95 s", "{:.2f}"),
                      ("hit", "prefix-hit rate", "{:.3f}"), ("loads", "CPU-tier loads", "{:d}"),
                      ("evictions", "CPU-tier evictions", "{:d}"), ("slot_loads", "slot loads", "{:d}")])
    for name, v in variants.items():
        s, reps = v["summary"], v["replicas"].values()
        side.add(placement=name, ok=f"{s['ok']}/{s['requests']}", output_tok_s=s["output_tokens_per_s"],
                 ttft_p50=s["ttft_p50"], ttft_p95=s["ttft_p95"], hit=v["hit"], loads=sum(r["loads"] for r in reps),
                 evictions=sum(r["evictions"] for r in reps), slot_loads=sum(r["slot_loads"] for r in reps))
    names = list(variants)
    per = Table("", [("adapter", "adapter (Zipf rank)")] + [
        c for n in names for c in ((f"{n}_requests", f"{n} requests", "{}"), (f"{n}_ttft", f"{n} TTFT p50 / p95 s", "{}"),
                                   (f"{n}_hit", f"{n} hit", "{:.3f}"))])
    for a in sorted({a for v in variants.values() for a in v["adapters"]}):
        row = {"adapter": f"a{a}"}
        for n in names:
            s = variants[n]["adapters"].get(a)
            if s is not None:
                row.update({f"{n}_requests": f"{s['ok']}/{s['requests']}", f"{n}_hit": s["hit"],
                            f"{n}_ttft": f"{_f(s['ttft_p50'])} / {_f(s['ttft_p95'])}"})
        per.add(**row)
    where = Table("", [("placement", "placement"), ("replica", "replica"), ("mix", "requests per adapter"),
                       ("loads", "CPU-tier loads", "{:d}"), ("evictions", "CPU-tier evictions", "{:d}"),
                       ("slot_loads", "slot loads", "{:d}")])
    for n, v in variants.items():
        for i, (rep, c) in enumerate(v["replicas"].items()):
            served = v["placement"].get(rep, Counter())
            where.add(placement=n, replica=f"r{i} ({rep[:8]})",
                      mix=" ".join(f"a{a}:{k}" for a, k in sorted(served.items())) or "-",
                      loads=c["loads"], evictions=c["evictions"], slot_loads=c["slot_loads"])
    return [side, per, where]


def verdict_lines(today: dict, new: dict) -> list[str]:
    v = verdict(today, new)
    met = lambda ok: "met" if ok else "MISSED"  # noqa: E731
    return [f"residency / today: TTFT p50 {_f(v['ttft_p50_ratio'])}x (target <= {TARGETS['ttft_p50']}x: "
            f"{met(v['ttft_met'])}); output tok/s {_f(v['tok_ratio'])}x (target >= {TARGETS['output_tok_s']}x: "
            f"{met(v['tok_met'])}); worst tenant prefix-hit change {_f(v['worst_hit_points'], '{:+.1f}')} points "
            f"(target >= -{TARGETS['hit_points']:.0f}: {met(v['hit_met'])})"]
