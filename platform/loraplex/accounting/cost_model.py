"""What a million tokens costs us: GPU-hour price x GPUs / (tokens/s x utilization x 3600) x 1e6.

"GPU" is the priced unit, `hardware` names it: a GPU on the GPU profile, a 2-vCPU VM on the CPU
profile (accounting.cost_model; its defaults follow the profile).

tokens/s is measured from the ledger: each record's prompt tokens are spread over
[arrival, first token] and its completion tokens over [first token, finish], summed into
`window_s` buckets. Peak = the busiest bucket (what the deployment has shown it can do);
average = all tokens / the whole period; utilization = average / peak. Capacity cost prices
tokens at peak throughput (100% busy); real cost is what the period actually cost per token.
"""
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Iterable, Optional

from sqlalchemy import Engine, select

from loraplex.accounting import render
from loraplex.accounting.period import check_range
from loraplex.accounting.pricing import MILLION, PriceBook
from loraplex.accounting.tables import usage_records as u
from loraplex.accounting.usage_query import usage_totals

_Q6 = Decimal("0.000001")


@dataclass
class CostModelReport:
    start: datetime
    end: datetime
    gpu_hour_price: Decimal
    gpus: int
    window_s: int
    requests: int
    tokens: int                  # prompt + completion tokens served
    peak_tokens_per_s: float
    avg_tokens_per_s: float
    utilization: float           # avg / peak, 0..1
    gpu_cost: Decimal            # GPU-hours in the period x price
    capacity_cost_per_1m: Decimal | None  # at peak throughput, fully busy
    real_cost_per_1m: Decimal | None      # at the measured utilization
    revenue: Decimal | None = None        # what tenants were billed, when a PriceBook is given
    hardware: str = "GPU"                 # what one unit at gpu_hour_price is (accounting.cost_model)
    model: str | None = None              # the one base model priced; None: the whole deployment

    def to_dict(self) -> dict:
        money = lambda d: None if d is None else str(d)  # noqa: E731
        return {"start": self.start.isoformat(), "end": self.end.isoformat(), "model": self.model,
                "hardware": self.hardware, "gpu_hour_price": str(self.gpu_hour_price), "gpus": self.gpus,
                "window_s": self.window_s,
                "requests": self.requests, "tokens": self.tokens,
                "peak_tokens_per_s": round(self.peak_tokens_per_s, 3),
                "avg_tokens_per_s": round(self.avg_tokens_per_s, 3), "utilization": round(self.utilization, 4),
                "gpu_cost": str(self.gpu_cost), "capacity_cost_per_1m": money(self.capacity_cost_per_1m),
                "real_cost_per_1m": money(self.real_cost_per_1m), "revenue": money(self.revenue)}

    @property
    def margin(self) -> Decimal | None:
        """What tenants were billed minus what the GPUs cost over the same range (None without
        prices)."""
        return margin(self.revenue, self.gpu_cost)

    def to_table(self) -> str:
        return render.text_table(["metric", "value"], [[k, "" if v is None else v] for k, v in self.to_dict().items()])


def margin(revenue: Decimal | None, gpu_cost: Decimal) -> Decimal | None:
    """Revenue minus GPU cost: the one margin (None when there is no revenue to compare)."""
    return None if revenue is None else revenue - gpu_cost


def per_million(gpu_hour_price: Decimal, gpus: int, tokens_per_s: float, utilization: float) -> Decimal | None:
    effective = Decimal(repr(tokens_per_s)) * Decimal(repr(utilization))
    if effective <= 0:
        return None
    return (gpu_hour_price * gpus / (effective * 3600) * MILLION).quantize(_Q6)


def cost_model_report(engine: Engine, start: datetime, end: datetime, *, gpu_hour_price: Decimal, gpus: int = 1,
                      window_s: int = 60, prices: PriceBook | None = None, hardware: str = "GPU",
                      base_model: str | None = None) -> CostModelReport:
    """`base_model`: one base's records only (its pool's hardware in gpus / gpu_hour_price); None: all."""
    check_range(start, end)
    t0, t1 = start.timestamp(), end.timestamp()
    q = (select(u.c.arrival_time, u.c.first_token_time, u.c.finish_time, u.c.prompt_tokens, u.c.completion_tokens)
         .where(u.c.finish_time >= start, u.c.arrival_time < end))
    if base_model is not None:
        q = q.where(u.c.base_model == base_model)
    with engine.connect() as conn:
        rows = conn.execution_options(yield_per=10_000).execute(q)
        tp = measured_throughput(((a.timestamp(), f.timestamp() if f else None, z.timestamp(), p, c)
                                  for a, f, z, p, c in rows), t0, t1, window_s)
        revenue = None
        if prices is not None:
            revenue = sum((prices.cost(t.tenant_id, t.prompt_tokens, t.cached_prompt_tokens, t.completion_tokens,
                                       t.batch, t.base_model) for t in usage_totals(conn, start, end, "tenant")
                           if base_model is None or t.base_model == base_model),
                          Decimal(0))
    gpu_cost = gpu_hour_price * gpus * Decimal(repr(t1 - t0)) / 3600
    peak, util = tp.peak_tokens_per_s, tp.utilization
    return CostModelReport(start, end, gpu_hour_price, gpus, window_s, tp.requests, round(tp.tokens), peak,
                           tp.avg_tokens_per_s, util, gpu_cost.quantize(_Q6),
                           per_million(gpu_hour_price, gpus, peak, 1.0), per_million(gpu_hour_price, gpus, peak, util),
                           revenue, hardware, base_model)


@dataclass
class Throughput:
    requests: int
    tokens: float                # prompt + completion tokens inside [t0, t1)
    peak_tokens_per_s: float     # the busiest window
    avg_tokens_per_s: float      # tokens / (t1 - t0)
    utilization: float           # avg / peak, 0..1


def measured_throughput(spans: Iterable[tuple[float, Optional[float], float, int, int]], t0: float, t1: float,
                        window_s: float) -> Throughput:
    """Tokens per second of requests given as (arrival, first token or None, finish, prompt tokens,
    completion tokens), times in epoch seconds, over [t0, t1) in `window_s` buckets: the ledger's
    records here, a load test's requests in bench/loadtest."""
    buckets: dict[int, float] = defaultdict(float)
    requests, tokens = 0, 0.0
    for a, first, f, prompt, completion in spans:
        mid = first if first is not None else a
        tokens += _spread(buckets, prompt, a, mid, t0, t1, window_s)
        tokens += _spread(buckets, completion, mid, f, t0, t1, window_s)
        requests += 1
    seconds = t1 - t0
    peak = max(buckets.values(), default=0.0) / window_s
    avg = tokens / seconds if seconds > 0 else 0.0
    return Throughput(requests, tokens, peak, avg, avg / peak if peak else 0.0)


def _spread(buckets: dict[int, float], n: int, a: float, b: float, t0: float, t1: float, w: float) -> float:
    """Add n tokens spread evenly over [a, b], clipped to [t0, t1); return the tokens kept."""
    if n <= 0:
        return 0.0
    if b <= a:  # instantaneous: all tokens at b
        if not t0 <= b < t1:
            return 0.0
        buckets[int((b - t0) // w)] += n
        return float(n)
    rate, lo, hi = n / (b - a), max(a, t0), min(b, t1)
    kept = 0.0
    i = int((lo - t0) // w)
    while lo < hi:
        # i counts up rather than being recomputed from lo: at a bucket edge, float rounding of
        # (lo - t0) // w can give the bucket just left, whose edge is lo (no progress).
        edge = min(hi, t0 + (i + 1) * w)
        if edge > lo:
            part = rate * (edge - lo)
            buckets[i] += part
            kept += part
            lo = edge
        i += 1
    return kept
