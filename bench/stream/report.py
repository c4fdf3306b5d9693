"""The streaming benchmark's rows, table, ratios and targets."""

from __future__ import annotations

from bench.percentile import or_nan, percentile


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


def print_table(rows: list[dict], hop: list[dict]) -> None:
    print()
    print("| mode | streams | variant | offered tok/s | delivered tok/s | delivered/offered | TTFT p50 ms "
          "| TTFT p99 ms | added TPOT p50 ms | added TPOT p99 ms | gap p99 ms | requests (failed) | load avg |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        offered = f"{r['offered']:,.0f}" if r["offered"] else "-"
        share = f"{r['delivered'] / r['offered']:.1%}" if r["offered"] else "-"
        errors = f" (HTTP {r['errors']})" if r["errors"] else ""
        print(f"| {r['mode']} | {r['streams']} | {r['variant']} | {offered} | {r['delivered']:,.0f} | {share} "
              f"| {r['ttft_p50']:.1f} | {r['ttft_p99']:.1f} | {r['tpot_p50']:.2f} | {r['tpot_p99']:.2f} "
              f"| {r['gap_p99']:.1f} | {r['requests']} ({r['failed']}){errors} | {r['load']:.1f} |")
    by = {(r["mode"], r["streams"], r["variant"]): r for r in rows}
    ratios = []
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
            ratios.append(" ".join(parts))
    if ratios:
        print("\n" + "\n".join(ratios))
    if hop:
        print("\nRay Serve handle hop alone (deployment to deployment, one item per token, no HTTP):")
        for h in hop:
            print(f"  {h['streams']} streams: {h['items'] / h['seconds']:,.0f} items/s")


def print_targets(rows: list[dict], window_s: float) -> None:
    by = {(r["mode"], r["streams"], r["variant"]): r for r in rows}
    print("\nTargets (issue 9):")
    paced = by.get(("paced", 128, "after"))
    if paced:
        share = paced["delivered"] / paced["offered"]
        print(f"  paced 128: delivered {share:.1%} of offered (>= 99%): {'MET' if share >= 0.99 else 'NOT MET'}; "
              f"added TPOT p99 {paced['tpot_p99']:.2f} ms (<= window {window_s * 1e3:.0f} ms): "
              f"{'MET' if paced['tpot_p99'] <= window_s * 1e3 else 'NOT MET'}")
        before = by.get(("paced", 128, "before"))
        if before:
            raised = paced["ttft_p50"] - before["ttft_p50"]
            print(f"  TTFT p50 at paced 128: {paced['ttft_p50']:.1f} ms vs {before['ttft_p50']:.1f} ms unbatched "
                  f"({raised:+.1f} ms; <= +5 ms: {'MET' if raised <= 5 else 'NOT MET'})")
    instant = [r for r in rows if r["mode"] == "instant" and r["variant"] == "after"]
    if instant:
        best = max(instant, key=lambda r: r["delivered"])
        print(f"  instant: best {best['delivered']:,.0f} tok/s at {best['streams']} streams (>= 20,000): "
              f"{'MET' if best['delivered'] >= 20000 else 'NOT MET'}")
