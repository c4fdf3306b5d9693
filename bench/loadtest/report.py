"""Results as JSON, a Markdown summary, and the latency-throughput plot."""

from __future__ import annotations

import sys
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
    """TTFT P95 and TPOT P95 against output tok/s, one line per target, the SLO as dashed lines.
    A PNG with matplotlib (Agg); without it, an SVG with the same content and a warning."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        try:
            _png_pillow(curves, slo, path, level_name)
        except ImportError:
            print("loadtest: neither matplotlib nor Pillow is installed: no plot", file=sys.stderr)
            return None
        print(f"loadtest: matplotlib is not installed: drew {path.name} with Pillow", file=sys.stderr)
        return path
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


COLORS = [(31, 119, 180), (255, 127, 14), (44, 160, 44), (148, 103, 189)]


def _png_pillow(curves: dict[str, list[dict]], slo, path: Path, level_name: str) -> None:
    """The same plot as matplotlib's, drawn with Pillow (which vLLM installs)."""
    from PIL import Image, ImageDraw, ImageFont

    W, H, L, R, T, B = 620, 460, 70, 20, 40, 60
    img = Image.new("RGB", (2 * W, H), "white")
    d = ImageDraw.Draw(img)
    font = ImageFont.load_default()
    pts_all = [s for lv in curves.values() for s in lv]
    xmax = _nice(max([s["output_tokens_per_s"] for s in pts_all] + [1e-9]) * 1.05)
    for panel, (key, limit, label) in enumerate((("ttft", slo.ttft_p95_s, "TTFT"), ("tpot", slo.tpot_p95_s, "TPOT"))):
        ox = panel * W
        ys = [s[f"{key}_{q}"] for s in pts_all for q in ("p50", "p95") if s[f"{key}_{q}"] is not None]
        ymax = _nice(max(ys + ([limit] if limit else []) + [1e-9]) * 1.1)

        def px(x, y):
            return ox + L + (W - L - R) * x / xmax, H - B - (H - T - B) * y / ymax

        d.rectangle([ox + L, T, ox + W - R, H - B], outline="black")
        for i in range(6):
            x, y = px(xmax * i / 5, ymax * i / 5)
            d.line([x, H - B, x, H - B + 4], fill="black")
            d.text((x, H - B + 6), f"{xmax * i / 5:.3g}", fill="black", font=font, anchor="ma")
            d.line([ox + L - 4, y, ox + L, y], fill="black")
            d.line([ox + L, y, ox + W - R, y], fill=(230, 230, 230))
            d.text((ox + L - 6, y), f"{ymax * i / 5:.3g}", fill="black", font=font, anchor="rm")
        d.text((ox + (W + L - R) / 2, H - 22), "output tokens/s", fill="black", font=font, anchor="mm")
        d.text((ox + 8, T - 22), f"{label} (s) vs throughput; points: {level_name}; solid P95, thin P50",
               fill="black", font=font)
        if limit is not None:
            _, y = px(0, limit)
            for x0 in range(int(ox + L), int(ox + W - R), 12):
                d.line([x0, y, min(x0 + 7, ox + W - R), y], fill="red", width=2)
            d.text((ox + W - R - 4, y - 4), f"SLO {label} P95 {limit:g} s", fill="red", font=font, anchor="rb")
        for i, (name, levels) in enumerate(curves.items()):
            c = COLORS[i % len(COLORS)]
            ordered = sorted(levels, key=lambda s: s["level"])
            for q, width in (("p95", 2), ("p50", 1)):
                xy = [px(s["output_tokens_per_s"], s[f"{key}_{q}"]) for s in ordered if s[f"{key}_{q}"] is not None]
                if len(xy) > 1:
                    d.line(xy, fill=c, width=width)
                for (x, y), s in zip(xy, [s for s in ordered if s[f"{key}_{q}"] is not None]):
                    r = 4 if q == "p95" else 2
                    d.ellipse([x - r, y - r, x + r, y + r], fill=c)
                    if q == "p95":
                        d.text((x + 5, y - 5), f"{s['level']:g}", fill=c, font=font, anchor="lb")
            d.text((ox + L + 8, T + 8 + 14 * i), name, fill=c, font=font)
    img.save(path)


def _nice(x: float) -> float:
    """x rounded up to 1, 2 or 5 x a power of ten (axis ends)."""
    import math

    if x <= 0:
        return 1.0
    e = 10 ** math.floor(math.log10(x))
    return next(m * e for m in (1, 2, 5, 10) if m * e >= x)
