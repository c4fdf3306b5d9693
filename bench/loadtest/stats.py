"""A level's summary, the SLO check, capacity search, replicas and cost.

Cost reuses loraplex.accounting.cost_model (the formula behind /admin/cost-model): tokens are
bucketed by `measured_throughput` exactly as the ledger's are, and priced by `per_million`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import Decimal
from typing import Iterable, Optional

from bench.percentile import percentile
from loraplex.accounting.cost_model import measured_throughput, per_million


def mean(values: Iterable[float]) -> Optional[float]:
    xs = [v for v in values if v is not None]
    return sum(xs) / len(xs) if xs else None


@dataclass(frozen=True)
class SLO:
    ttft_p95_s: Optional[float] = None
    tpot_p95_s: Optional[float] = None
    max_error_rate: float = 0.0

    def check(self, s: dict) -> tuple[bool, list[str]]:
        """(met, reasons it is not) for one level's summary."""
        why = []
        if s["requests"] == 0 or s["ok"] == 0:
            return False, ["no successful request"]
        if s["error_rate"] > self.max_error_rate:
            why.append(f"errors {s['error_rate']:.1%} > {self.max_error_rate:.1%}")
        if self.ttft_p95_s is not None and (s["ttft_p95"] is None or s["ttft_p95"] > self.ttft_p95_s):
            why.append(f"TTFT P95 {_fmt(s['ttft_p95'])} s > {self.ttft_p95_s} s")
        if self.tpot_p95_s is not None and (s["tpot_p95"] is None or s["tpot_p95"] > self.tpot_p95_s):
            why.append(f"TPOT P95 {_fmt(s['tpot_p95'])} s > {self.tpot_p95_s} s")
        return not why, why


def _fmt(x) -> str:
    return "-" if x is None else f"{x:.3f}"


def summarize(results: list[dict], level: float, window_s: float = 5.0) -> dict:
    """One level's figures from its per-request results (see client.py for their fields)."""
    ok = [r for r in results if r["status"] == "ok"]
    if results:
        t0 = min(r["start"] for r in results)
        t1 = max(r["end"] for r in results)
    else:
        t0 = t1 = 0.0
    duration = max(t1 - t0, 1e-9)
    out_tokens = sum(r["completion_tokens"] or 0 for r in ok)
    in_tokens = sum(r["prompt_tokens"] or 0 for r in ok)
    ttft = [r["ttft"] for r in ok]
    tpot = [r["tpot"] for r in ok]
    e2e = [r["e2e"] for r in ok]
    # Same bucketing as /admin/cost-model: prompt tokens over [arrival, first token], completion
    # tokens over [first token, finish]; peak = busiest window, utilization = average / peak.
    spans = [(r["start_epoch"], r["first_token_epoch"], r["end_epoch"], r["prompt_tokens"] or 0,
              r["completion_tokens"] or 0) for r in ok]
    tp = measured_throughput(spans, min((s[0] for s in spans), default=0.0),
                             max((s[2] for s in spans), default=0.0), window_s) if spans else None
    return {
        "level": level,
        "requests": len(results),
        "ok": len(ok),
        "failed": len(results) - len(ok),
        "error_rate": (len(results) - len(ok)) / len(results) if results else 0.0,
        "statuses": _count(r["status"] for r in results),
        "duration_s": duration,
        "requests_per_s": len(ok) / duration,
        "output_tokens_per_s": out_tokens / duration,
        "total_tokens_per_s": (in_tokens + out_tokens) / duration,
        "prompt_tokens_mean": mean(r["prompt_tokens"] for r in ok),
        "completion_tokens_mean": mean(r["completion_tokens"] for r in ok),
        "mean_in_flight": sum(e2e) / duration,
        "ttft_p50": percentile(ttft, 50), "ttft_p95": percentile(ttft, 95), "ttft_p99": percentile(ttft, 99),
        "tpot_p50": percentile(tpot, 50), "tpot_p95": percentile(tpot, 95), "tpot_p99": percentile(tpot, 99),
        "e2e_p50": percentile(e2e, 50), "e2e_p95": percentile(e2e, 95),
        "peak_tokens_per_s": tp.peak_tokens_per_s if tp else 0.0,
        "utilization": tp.utilization if tp else 0.0,
    }


def _count(xs: Iterable[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for x in xs:
        out[x] = out.get(x, 0) + 1
    return out


def capacity(levels: list[dict], slo: SLO) -> dict:
    """The highest level such that it and every lower level meet the SLO (a level that passes
    above a failing one is noise, not capacity: it is reported, not used)."""
    ordered = sorted(levels, key=lambda s: s["level"])
    cap = None
    broke = False
    above = []
    for s in ordered:
        met, _ = slo.check(s)
        if met and not broke:
            cap = s
        elif met:
            above.append(s["level"])
        else:
            broke = True
    return {"capacity": cap["level"] if cap else None, "at": cap,
            "all_met": bool(ordered) and not broke, "met_above_first_miss": above}


def replicas_needed(peak_concurrency: Optional[float], capacity_level: Optional[float]) -> Optional[int]:
    if peak_concurrency is None or not capacity_level:
        return None
    return max(1, math.ceil(peak_concurrency / capacity_level))


def cost_summary(at: dict, gpu_hour_price: Decimal, gpus_per_replica: int,
                 peak_concurrency: Optional[float] = None, capacity_level: Optional[float] = None,
                 utilization: Optional[float] = None) -> dict:
    """$ per 1M tokens (prompt + completion, as /admin/cost-model counts) at the capacity level:
    at its busiest window (capacity cost, fully busy), at the utilization that level actually
    measured (average / peak), at a given utilization (production's), and, given a peak concurrency, for the fleet sized for it (whose
    replicas run at peak / (replicas x capacity) of the capacity level's load)."""
    peak_tps, util = at["peak_tokens_per_s"], at["utilization"]
    out = {"gpu_hour_price": str(gpu_hour_price), "gpus_per_replica": gpus_per_replica,
           "tokens_per_s_peak": peak_tps, "utilization_measured": util,
           "capacity_cost_per_1m": _money(per_million(gpu_hour_price, gpus_per_replica, peak_tps, 1.0)),
           "measured_cost_per_1m": _money(per_million(gpu_hour_price, gpus_per_replica, peak_tps, util))}
    if utilization is not None:  # production's, e.g. from /admin/cost-model over a month
        out.update(utilization_given=utilization,
                   given_cost_per_1m=_money(per_million(gpu_hour_price, gpus_per_replica, peak_tps, utilization)))
    k = replicas_needed(peak_concurrency, capacity_level)
    if k:
        fleet_util = peak_concurrency / (k * capacity_level)
        out.update(replicas=k, fleet_utilization_at_peak=fleet_util,
                   fleet_cost_per_1m_at_peak=_money(per_million(gpu_hour_price, gpus_per_replica * k,
                                                                at["total_tokens_per_s"] * k, fleet_util)))
    return out


def _money(d: Optional[Decimal]) -> Optional[str]:
    return None if d is None else str(d)
