"""TTFT / TPOT percentiles from the usage ledger's timestamps: the admin console's latency panel
when no Prometheus is configured (console.prometheus_url).

Same definitions as the `loraplex_*` histograms (loraplex/metrics/catalog.py): TTFT = first token
- arrival at the ingress; TPOT = (finish - first token) / (completion tokens - 1), for requests
with at least two tokens. Percentiles over the records themselves, not bucket estimates, by linear
interpolation between the closest ranks (numpy's default; bench/percentile.py's and `vllm bench
serve`'s definition, so the console and the benchmarks agree)."""

from dataclasses import dataclass
from datetime import datetime
from typing import Optional

import numpy as np
from sqlalchemy import Engine, select

from loraplex.accounting.period import check_range
from loraplex.accounting.tables import usage_records as u


@dataclass
class LedgerLatency:
    requests: int  # records that finished in the window
    ttft_p95_s: Optional[float]  # None: no record had a first token
    tpot_p95_s: Optional[float]  # None: no record had two tokens or more


def ledger_latency(engine: Engine, start: datetime, end: datetime, q: float = 0.95) -> LedgerLatency:
    """The q-quantiles of TTFT and TPOT of the requests that finished in [start, end)."""
    check_range(start, end)
    query = (select(u.c.arrival_time, u.c.first_token_time, u.c.finish_time, u.c.completion_tokens)
             .where(u.c.finish_time >= start, u.c.finish_time < end))
    ttft, tpot, n = [], [], 0
    with engine.connect() as conn:
        for arrival, first, finish, tokens in conn.execute(query):
            n += 1
            if first is None:
                continue
            ttft.append(max((first - arrival).total_seconds(), 0.0))
            if tokens > 1:
                tpot.append(max((finish - first).total_seconds(), 0.0) / (tokens - 1))
    # numpy's "linear" quantile, the definition bench/percentile.py names for every benchmark
    return LedgerLatency(n, float(np.quantile(ttft, q)) if ttft else None,
                         float(np.quantile(tpot, q)) if tpot else None)
