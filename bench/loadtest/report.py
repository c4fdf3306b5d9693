"""Results as JSON, a Markdown summary, and the latency-throughput plot."""

from __future__ import annotations

from pathlib import Path
from typing import Optional


def _f(x, digits=2, scale=1.0) -> str:
    return "-" if x is None else f"{x * scale:,.{digits}f}"


def curve_table(levels: list[dict], slo, level_name: str = "concurrency") -> str:
    head = (f"| {level_name} | requests | failed | requests/s | output tok/s | TTFT P50 s | TTFT P95 s | "
            "TPOT P50 ms | TPOT P95 ms | E2E P50 s | meets SLO |\n|" + "---|" * 11)
    rows = []
    for s in sorted(levels, key=lambda s: s["level"]):
        met, why = slo.check(s)
        rows.append(f"| {s['level']:g} | {s['requests']} | {s['failed']} | {_f(s['requests_per_s'], 3)} | "
                    f"{_f(s['output_tokens_per_s'], 1)} | {_f(s['ttft_p50'])} | {_f(s['ttft_p95'])} | "
                    f"{_f(s['tpot_p50'], 1, 1e3)} | {_f(s['tpot_p95'], 1, 1e3)} | {_f(s['e2e_p50'])} | "
                    f"{'yes' if met else 'no (' + '; '.join(why) + ')'} |")
    return "\n".join([head, *rows])


def class_capacity_table(classes: dict[str, dict], level_name: str = "concurrency") -> str:
    """One row per SLO class (slo_classes.per_class): its targets, its capacity and its figures there."""
    head = (f"| class | tenants | TTFT P95 target s | TPOT P95 target ms | capacity ({level_name}) | "
            "TTFT P95 s there | TPOT P95 ms there | requests there |\n|" + "---|" * 8)
    rows = []
    for name, c in classes.items():
        at = next((s for s in c["levels"] if s["level"] == c["capacity"]), None)
        cap = "none" if c["capacity"] is None else f"{c['capacity']:g}" + ("+" if c["all_levels_met"] else "")
        rows.append(f"| {name} | {', '.join(str(t) for t in c['tenants'])} | {_f(c['ttft_p95_s'])} | "
                    f"{_f(c['tpot_p95_s'], 1, 1e3)} | {cap} | {_f(at and at['ttft_p95'])} | "
                    f"{_f(at and at['tpot_p95'], 1, 1e3)} | {at['requests'] if at else '-'} |")
    return "\n".join([head, *rows])


def capacity_lines(cap: dict, cost: Optional[dict], peak: Optional[float], level_name: str) -> list[str]:
    out = []
    if cap["capacity"] is None:
        out.append(f"- capacity: none: the lowest {level_name} swept already misses the SLO")
        return out
    c = cap["capacity"]
    at_max = cap["all_met"]
    out.append(f"- capacity (highest {level_name} meeting the SLO, every lower one meeting it too): "
               f"**{c:g}**" + (" (every level swept met it: sweep higher to find the limit)" if at_max else ""))
    if cap["met_above_first_miss"]:
        out.append(f"  - also met above the first miss (noise, not counted): {cap['met_above_first_miss']}")
    if level_name == "concurrency":
        out.append(f"- `max_num_seqs` to set: {'at least ' if at_max else ''}**{int(c)}** (engine: batch no more "
                   "than the SLO allows; later requests queue instead of slowing every running one)")
    else:
        out.append(f"- measured requests in flight at that rate: {cap['at']['mean_in_flight']:.1f} "
                   "(Little's law: requests/s x mean latency): a `max_num_seqs` of at least that")
    if peak is not None and cost and cost.get("replicas"):
        out.append(f"- replicas for a peak of {peak:g} concurrent requests: **{cost['replicas']}** "
                   f"(each at {cost['fleet_utilization_at_peak']:.0%} of its capacity at peak)")
    if cost:
        out.append(f"- cost per 1M tokens (prompt + completion) at {cost['gpu_hour_price']}/GPU-hour x "
                   f"{cost['gpus_per_replica']} GPU(s) per replica, from loraplex.accounting.cost_model:")
        out.append(f"  - at capacity, fully busy ({cost['tokens_per_s_peak']:.1f} tok/s, busiest window): "
                   f"**{cost['capacity_cost_per_1m']}**")
        out.append(f"  - at the utilization measured at that level ({cost['utilization_measured']:.0%}): "
                   f"**{cost['measured_cost_per_1m']}**")
        if cost.get("given_cost_per_1m"):
            out.append(f"  - at the given utilization ({cost['utilization_given']:.0%}, e.g. `loraplex billing "
                       f"cost-model`'s): **{cost['given_cost_per_1m']}**")
        if cost.get("fleet_cost_per_1m_at_peak"):
            out.append(f"  - the fleet of {cost['replicas']} at the peak: **{cost['fleet_cost_per_1m_at_peak']}**")
    return out


def comparison_table(a_name: str, a: list[dict], b_name: str, b: list[dict], level_name: str) -> str:
    by = {s["level"]: s for s in b}
    head = (f"| {level_name} | {a_name} output tok/s | {b_name} output tok/s | ratio | "
            f"{a_name} TTFT P50 s | {b_name} TTFT P50 s | TTFT P50 delta s | {a_name} TPOT P50 ms | "
            f"{b_name} TPOT P50 ms | TPOT P50 delta ms |\n|" + "---|" * 10)
    rows = []
    for s in sorted(a, key=lambda s: s["level"]):
        o = by.get(s["level"])
        if not o:
            continue
        ratio = s["output_tokens_per_s"] / o["output_tokens_per_s"] if o["output_tokens_per_s"] else None
        d_ttft = None if None in (s["ttft_p50"], o["ttft_p50"]) else s["ttft_p50"] - o["ttft_p50"]
        d_tpot = None if None in (s["tpot_p50"], o["tpot_p50"]) else s["tpot_p50"] - o["tpot_p50"]
        rows.append(f"| {s['level']:g} | {_f(s['output_tokens_per_s'], 1)} | {_f(o['output_tokens_per_s'], 1)} | "
                    f"{_f(ratio, 3)}x | {_f(s['ttft_p50'])} | {_f(o['ttft_p50'])} | {_f(d_ttft, 2)} | "
                    f"{_f(s['tpot_p50'], 1, 1e3)} | {_f(o['tpot_p50'], 1, 1e3)} | {_f(d_tpot, 1, 1e3)} |")
    return "\n".join([head, *rows])


def lora_table(runs: dict[str, dict[str, list[dict]]]) -> str:
    """runs[target][scenario] = levels (one level each). Ratio to base per target, and the
    platform's ratio to the bare server's for the same scenario."""
    targets = list(runs)
    scen = list(next(iter(runs.values())))
    cols = []
    for t in targets:
        cols += [f"{t} output tok/s", f"{t} / base", f"{t} TTFT P50 s", f"{t} TPOT P50 ms"]
    if len(targets) == 2:
        cols.append(f"{targets[0]} / {targets[1]}")
    head = "| adapters in flight | " + " | ".join(cols) + " |\n|" + "---|" * (len(cols) + 1)
    rows = []
    for sc in scen:
        cells = []
        for t in targets:
            s = runs[t][sc][0]
            base = runs[t].get("base", [None])[0]
            r = s["output_tokens_per_s"] / base["output_tokens_per_s"] if base and base["output_tokens_per_s"] else None
            cells += [_f(s["output_tokens_per_s"], 1), _f(r, 3) + "x", _f(s["ttft_p50"]), _f(s["tpot_p50"], 1, 1e3)]
        if len(targets) == 2:
            a, b = runs[targets[0]][sc][0], runs[targets[1]][sc][0]
            cells.append(_f(a["output_tokens_per_s"] / b["output_tokens_per_s"] if b["output_tokens_per_s"] else None,
                            3) + "x")
        rows.append(f"| {sc} | " + " | ".join(cells) + " |")
    return "\n".join([head, *rows])


def plot(curves: dict[str, list[dict]], slo, path: Path, level_name: str = "concurrency") -> Optional[Path]:
    """TTFT P95 and TPOT P95 against output tok/s, one line per target, the SLO as dashed lines
    (a PNG; matplotlib comes with the `bench` extra that scripts/setup installs)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    for ax, key, limit, label in ((axes[0], "ttft", slo.ttft_p95_s, "TTFT"), (axes[1], "tpot", slo.tpot_p95_s, "TPOT")):
        for i, (name, levels) in enumerate(curves.items()):
            pts = sorted(levels, key=lambda s: s["level"])
            xs = [s["output_tokens_per_s"] for s in pts]
            for q, style in (("p95", "-o"), ("p50", ":.")):
                ys = [s[f"{key}_{q}"] for s in pts]
                ax.plot(xs, ys, style, color=f"C{i}", label=f"{name} {label} {q.upper()}")
            for s in pts:
                ax.annotate(f"{s['level']:g}", (s["output_tokens_per_s"], s[f"{key}_p95"] or 0),
                            textcoords="offset points", xytext=(4, 4), fontsize=7)
        if limit is not None:
            ax.axhline(limit, color="red", linestyle="--", label=f"SLO {label} P95 {limit:g} s")
        ax.set_xlabel("output tokens/s")
        ax.set_ylabel(f"{label} (s)")
        ax.set_title(f"{label} vs throughput (points: {level_name})")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def ratio_table(results: dict, bare_names: list[str]) -> str:
    """Every other target's output tok/s and TTFT P50 against each bare vLLM's on the same workload
    (scenario, round, pass) and level: results[target][key] = {"levels": [...]}."""
    cols = [f"{kind} / {b}" for b in bare_names for kind in ("out tok/s", "TTFT P50")]
    head = ("| workload | target | output tok/s | TTFT P50 s | TPOT P50 ms | " + " | ".join(cols) + " |\n|"
            + "---|" * (5 + len(cols)))
    rows = []
    keys = list(dict.fromkeys(k for per in results.values() for k in per))
    for key in keys:
        for t, per in results.items():
            for s in per.get(key, {}).get("levels", []):
                cells = []
                for b in bare_names:
                    o = next((x for x in results[b].get(key, {}).get("levels", []) if x["level"] == s["level"]), None)
                    if o is None:
                        cells += ["-", "-"]
                        continue
                    out = s["output_tokens_per_s"] / o["output_tokens_per_s"] if o["output_tokens_per_s"] else None
                    ttft = s["ttft_p50"] / o["ttft_p50"] if s["ttft_p50"] and o["ttft_p50"] else None
                    cells += [_f(out, 3) + "x", _f(ttft, 3) + "x"]
                rows.append(f"| {key} | {t} | {_f(s['output_tokens_per_s'], 1)} | {_f(s['ttft_p50'])} | "
                            f"{_f(s['tpot_p50'], 1, 1e3)} | " + " | ".join(cells) + " |")
    return "\n".join([head, *rows])
