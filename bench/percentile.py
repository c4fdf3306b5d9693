"""The one percentile every benchmark reports.

Linear interpolation between the closest ranks (numpy's default method, "linear"): the q-th
percentile of sorted xs sits at position (n - 1) * q / 100 and is read between the two values
around it. Chosen because `vllm bench serve` reports it, and the load test compares the platform
against bare vLLM through it: one definition on both sides of that ratio. (Nearest rank and the
floor index, which the scripts used before, pick a sample and jump with n; on 10 values they put
p99 at the maximum.)
"""

from __future__ import annotations

import math
from typing import Iterable, Optional


def percentile(values: Iterable[Optional[float]], q: float) -> Optional[float]:
    """The q-th percentile (q in 0..100) of the values that are not None, by linear
    interpolation; None when there are none."""
    xs = sorted(v for v in values if v is not None)
    if not xs:
        return None
    if not 0 <= q <= 100:
        raise ValueError(f"percentile: q must be in [0, 100], got {q}")
    pos = (len(xs) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def or_nan(x: Optional[float]) -> float:
    """A percentile of no values (None) as nan, for tables that print a dash or do arithmetic."""
    return float("nan") if x is None else x
