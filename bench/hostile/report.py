"""The hostile client's tables: per attack, what the attacker got and what the bystander saw."""

from __future__ import annotations

from bench.hostile.attack import AttackResult, BystanderStats


def _ms(x) -> str:
    return "-" if x is None else f"{x * 1000:.0f}"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def bystander_row(label: str, stats: BystanderStats | None) -> str:
    if stats is None:
        return f"| {label} | - | - | - | - | - |"
    refusals = "; ".join(f"{n} x {_cell(k)}" for k, n in stats.refusals.most_common(3)) or "0"
    within = f"{stats.within_slo / stats.requests:.0%}" if stats.requests else "-"
    return f"| {label} | {stats.requests} | {refusals} | {within} | {_ms(stats.p(50))} | {_ms(stats.p(95))} |"


def render(result: AttackResult) -> str:
    lines = [f"### {result.name}", "", _cell(result.what), "",
             "| attacker got | count |", "|---|---|"]
    for what, n in sorted(result.attacker.items(), key=lambda kv: -kv[1]):
        lines.append(f"| {_cell(what)} | {n} |")
    if not result.attacker:
        lines.append("| (nothing) | 0 |")
    lines += ["", "| bystander | requests | refusals | within SLO | p50 ms | p95 ms |", "|---|---|---|---|---|---|",
              bystander_row("alone", result.alone), bystander_row("under attack", result.bystander)]
    alone95 = result.alone.p(95) if result.alone else None
    under95 = result.bystander.p(95)
    if alone95 and under95:
        lines += ["", f"bystander p95 under attack / alone: **{under95 / alone95:.2f}x**"]
    if result.notes:
        lines += ["", _cell(result.notes)]
    return "\n".join(lines) + "\n"
