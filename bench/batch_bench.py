"""A batch beside an online load that rises and falls (issue 36), for python -m bench batch: the
online workload of a phase, and the tables (online latency alone vs beside the batch, the batch's
progress, the cost model's utilization and cost per 1M tokens before and after, side by side)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from bench.loadtest.workload import Prompt, RequestSpec, Tenant, Workload
from bench.percentile import percentile
from bench.report import Column, Table

REFUSED = ("http_429", "http_503")  # admission's refusals: counted apart from failures


def online_workload(prompts: list[Prompt], arrivals: list[float], tag: str) -> Workload:
    """One request per arrival (seconds from the phase's start), streamed, exactly max_tokens
    (ignore_eos, greedy). `tag` starts every question, so no block of the prefix cache is shared
    with another request, in this phase or another."""
    reqs = [RequestSpec(i, 0, None, f"[{tag}-{i}] {p.text}", p.max_tokens, system=False, arrival_s=at,
                        ignore_eos=True) for i, (p, at) in enumerate(zip(prompts, arrivals))]
    return Workload([Tenant("online", "")], [], reqs, "ShareGPT first questions", exact_lengths=True)


@dataclass
class Phase:
    name: str
    start: float                 # epoch: the profile's t = 0
    end: float                   # epoch: the last online response
    results: list[dict]          # per request (bench/loadtest/client.py), with "at": its arrival offset
    summary: dict                # bench/loadtest/stats.py summarize
    window: tuple[float, float] = (0.0, 0.0)  # epochs the cost model is asked about
    cost: dict = field(default_factory=dict)   # GET /admin/cost-model over `window`
    batch_lines: Optional[tuple[int, int]] = None  # (completed, failed) by the window's end

    @property
    def refused(self) -> int:
        return sum(self.summary["statuses"].get(s, 0) for s in REFUSED)


def _x(a, b) -> str:
    return f"{b / a:.2f}x" if a and b is not None else "-"


def _s(x, scale=1.0, digits=3) -> str:
    return "-" if x is None else f"{x * scale:.{digits}f}"


def _money(x) -> str:
    return "-" if x is None else f"${float(x):.4f}"


def side_by_side(phases: list[Phase]) -> Table:
    """Rows of figures, a column per phase, the ratio of the second to the first (the first: alone)."""
    a, b = phases[0], phases[1]
    table = Table("", [("figure", "")] + [Column(f"phase{i}", p.name, right=True) for i, p in enumerate(phases)]
                  + [Column("ratio", f"{b.name} / {a.name}", right=True)])

    def row(label, fmt, ratio=True):
        table.add(figure=label, **{f"phase{i}": fmt(p) for i, p in enumerate(phases)},
                  ratio=ratio(a, b) if callable(ratio) else "")

    s = lambda p: p.summary  # noqa: E731
    row("online requests ok / sent", lambda p: f"{s(p)['ok']}/{s(p)['requests']}", None)
    row("online refused (429 / 503)", lambda p: str(p.refused), None)
    for key, label, scale, digits in [("ttft_p50", "online TTFT p50 (s)", 1, 3), ("ttft_p95", "online TTFT p95 (s)", 1, 3),
                                      ("tpot_p50", "online TPOT p50 (ms)", 1e3, 1),
                                      ("tpot_p95", "online TPOT p95 (ms)", 1e3, 1)]:
        row(label, lambda p, k=key, sc=scale, d=digits: _s(s(p)[k], sc, d), lambda x, y, k=key: _x(s(x)[k], s(y)[k]))
    row("online output tok/s", lambda p: f"{s(p)['output_tokens_per_s']:.1f}", None)
    row("batch lines completed / failed in the window",
        lambda p: "-" if p.batch_lines is None else f"{p.batch_lines[0]} / {p.batch_lines[1]}", None)
    row("cost-model window (s)", lambda p: f"{p.window[1] - p.window[0]:.0f}", None)
    row("requests in the ledger (online + batch lines)", lambda p: str(p.cost.get("requests", "-")), None)
    row("tokens served (prompt + completion)", lambda p: f"{p.cost.get('tokens', 0):,}",
        lambda x, y: _x(x.cost.get("tokens"), y.cost.get("tokens")))
    row("peak tok/s (busiest 60 s)", lambda p: _s(p.cost.get("peak_tokens_per_s"), 1, 1), None)
    row("average tok/s", lambda p: _s(p.cost.get("avg_tokens_per_s"), 1, 1),
        lambda x, y: _x(x.cost.get("avg_tokens_per_s"), y.cost.get("avg_tokens_per_s")))
    row("utilization (average / peak)", lambda p: _s(p.cost.get("utilization"), 100, 1) + " %",
        lambda x, y: _x(x.cost.get("utilization"), y.cost.get("utilization")))
    # Each window's own peak moves with what ran in it (the batch raises it), so its utilization
    # does not compare across windows; against the run's busiest 60 s it does.
    top = max((p.cost.get("peak_tokens_per_s") or 0.0) for p in phases)
    row("utilization against the run's busiest 60 s", lambda p: _s((p.cost.get("avg_tokens_per_s") or 0) / top
                                                                  if top else None, 100, 1) + " %",
        lambda x, y: _x(x.cost.get("avg_tokens_per_s"), y.cost.get("avg_tokens_per_s")))
    row("capacity cost per 1M tokens (at peak)", lambda p: _money(p.cost.get("capacity_cost_per_1m")), None)
    row("real cost per 1M tokens", lambda p: _money(p.cost.get("real_cost_per_1m")),
        lambda x, y: _x(_f(x.cost.get("real_cost_per_1m")), _f(y.cost.get("real_cost_per_1m"))))
    row("billed to tenants (list prices)", lambda p: _money(p.cost.get("revenue")), None)
    return table


def _f(x) -> Optional[float]:
    return None if x is None else float(x)


def by_part(alone: Phase, beside: Phase, duration_s: float, rate, batch_done) -> str:
    """Each quarter of the profile (valley, rise, fall, valley): its mean rate, the online
    requests that arrived in it with their TTFT / TPOT p50 and p95 alone and beside the batch, and the batch lines
    completed in it (`batch_done(t)`: lines completed by t seconds from the phase start)."""
    q = duration_s / 4
    names = ["valley", "rise to peak", "fall from peak", "valley"]
    table = Table("", [("part", "part (s)"), ("rate", "rate req/s", "{:.2f}"), Column("requests", "online requests", right=True),
                       Column("ttft_p95", "TTFT p95 alone / with (s)", right=True),
                       Column("tpot_p50", "TPOT p50 alone / with (ms)", right=True),
                       Column("tpot_p95", "TPOT p95 alone / with (ms)", right=True),
                       ("batch_lines", "batch lines completed in it", "{:d}")])
    for i, name in enumerate(names):
        lo, hi = i * q, (i + 1) * q
        mean_rate = sum(rate(lo + (hi - lo) * k / 20) for k in range(21)) / 21
        pa = [r for r in alone.results if r["status"] == "ok" and lo <= r["at"] < hi]
        pb = [r for r in beside.results if r["status"] == "ok" and lo <= r["at"] < hi]

        def pair(key, p, scale=1.0, digits=2):
            return (f"{_s(percentile([r[key] for r in pa if r[key] is not None], p), scale, digits)} / "
                    f"{_s(percentile([r[key] for r in pb if r[key] is not None], p), scale, digits)}")

        table.add(part=f"{name} ({lo:.0f}-{hi:.0f})", rate=mean_rate, requests=f"{len(pa)} / {len(pb)}",
                  ttft_p95=pair("ttft", 95), tpot_p50=pair("tpot", 50, 1e3, 0), tpot_p95=pair("tpot", 95, 1e3, 0),
                  batch_lines=batch_done(hi) - batch_done(lo))
    return table
