"""The streaming benchmark's rows, table, ratios and targets."""

from __future__ import annotations

from bench.percentile import or_nan, percentile
from bench.report import Table


def summarize(mode: str, variant: str, r: dict, interval: float) -> dict:
    paced = mode == "paced"
    delivered = r["flow_tok_s"] if paced else r["wall_tok_s"]
    offered = r["streams"] / interval if paced else None
    tpot_add = interval if paced else 0.0
    return {
        "mode": mode, "streams": r["streams"], "variant": variant, "offered": offered, "delivered": delivered,
        "ttft_p50": or_nan(percentile(r["ttft"], 50)) * 1e3, "ttft_p99": or_nan(percentile(r["ttft"], 99)) * 1e3,
        "tpot_p50": (or_nan(percentile(r["tpot"], 50)) - tpot_add) * 1e3, "tpot_p99": (or_nan(percentile(r["tpot"], 99)) - tpot_add) * 1e3,
        "gap_p99": or_nan(percentile(r["gaps"], 99)) * 1e3, "failed": r["failed"], "requests": r["requests"], "errors": r["errors"],
        "tokens": r["tokens"],
    }


COLUMNS = [("mode", "mode"), ("streams", "streams", "{:d}"), ("variant", "variant"),
           ("offered", "offered tok/s", "{:,.0f}"), ("delivered", "delivered tok/s", "{:,.0f}"),
           ("share", "delivered/offered", "{:.1%}"), ("ttft_p50", "TTFT p50 ms", "{:.1f}"),
           ("ttft_p99", "TTFT p99 ms", "{:.1f}"), ("tpot_p50", "added TPOT p50 ms", "{:.2f}"),
           ("tpot_p99", "added TPOT p99 ms", "{:.2f}"), ("gap_p99", "gap p99 ms", "{:.1f}"),
           ("requests_failed", "requests (failed)"), ("load", "load avg", "{:.1f}")]


def report(out, rows: list[dict], hop: list[dict], window_s: float) -> None:
    """The table, the ratios after / before and after / bare, the handle hop and the targets."""
    for r in rows:
        r["share"] = r["delivered"] / r["offered"] if r["offered"] else None
        r["requests_failed"] = f"{r['requests']} ({r['failed']})" + (f" (HTTP {r['errors']})" if r["errors"] else "")
    out.table(Table("", COLUMNS, rows))
    by = {(r["mode"], r["streams"], r["variant"]): r for r in rows}
    for (mode, streams, variant), r in by.items():
        if variant != "after":
            continue
        parts = [f"{mode} {streams}:"]
        for base in ("before", "bare"):
            b = by.get((mode, streams, base))
            if b and b["delivered"]:
                parts.append(f"after/{base} {r['delivered'] / b['delivered']:.2f}x tok/s, "
                             f"TTFT p50 {r['ttft_p50'] - b['ttft_p50']:+.1f} ms")
        if len(parts) > 1:
            out.note(" ".join(parts))
    if hop:
        for h in hop:
            h["items_per_s"] = h["items"] / h["seconds"]
        out.table(Table("Ray Serve handle hop alone (deployment to deployment, one item per token, no HTTP):",
                        [("streams", "streams", "{:d}"), ("items_per_s", "items/s", "{:,.0f}")], hop))
    targets(out, rows, window_s)


def targets(out, rows: list[dict], window_s: float) -> None:
    by = {(r["mode"], r["streams"], r["variant"]): r for r in rows}
    out.note("\nTargets (issue 9):")
    paced = by.get(("paced", 128, "after"))
    if paced:
        share = paced["delivered"] / paced["offered"]
        out.note(f"  paced 128: delivered {share:.1%} of offered (>= 99%): {'MET' if share >= 0.99 else 'NOT MET'}; "
                 f"added TPOT p99 {paced['tpot_p99']:.2f} ms (<= window {window_s * 1e3:.0f} ms): "
                 f"{'MET' if paced['tpot_p99'] <= window_s * 1e3 else 'NOT MET'}")
        before = by.get(("paced", 128, "before"))
        if before:
            raised = paced["ttft_p50"] - before["ttft_p50"]
            out.note(f"  TTFT p50 at paced 128: {paced['ttft_p50']:.1f} ms vs {before['ttft_p50']:.1f} ms unbatched "
                     f"({raised:+.1f} ms; <= +5 ms: {'MET' if raised <= 5 else 'NOT MET'})")
    instant = [r for r in rows if r["mode"] == "instant" and r["variant"] == "after"]
    if instant:
        best = max(instant, key=lambda r: r["delivered"])
        out.note(f"  instant: best {best['delivered']:,.0f} tok/s at {best['streams']} streams (>= 20,000): "
                 f"{'MET' if best['delivered'] >= 20000 else 'NOT MET'}")
