"""When requests are sent: closed loop (fixed concurrency) or open loop (Poisson / gamma arrivals).

Open loop follows `vllm bench serve`'s convention: inter-arrival gaps are Gamma(shape=burstiness,
scale=1/(rate x burstiness)), so the mean gap is 1/rate whatever the burstiness; burstiness 1 is
a Poisson process, below 1 burstier (coefficient of variation 1/sqrt(burstiness)), above 1 more
regular.
"""

from __future__ import annotations

import math
import random


def interarrival_gaps(n: int, rate: float, burstiness: float = 1.0, rng: random.Random | None = None) -> list[float]:
    """n gaps (seconds) between consecutive arrivals at `rate` requests/s. rate inf: all at once."""
    if n <= 0:
        return []
    if burstiness <= 0:
        raise ValueError("burstiness must be > 0 (1 = Poisson)")
    if rate <= 0:
        raise ValueError("rate must be > 0 requests/s")
    if math.isinf(rate):
        return [0.0] * n
    rng = rng or random.Random(0)
    scale = 1.0 / (rate * burstiness)
    return [rng.gammavariate(burstiness, scale) for _ in range(n)]


def arrival_offsets(n: int, rate: float, burstiness: float = 1.0, rng: random.Random | None = None) -> list[float]:
    """Send times (seconds from the start); the first request goes at 0."""
    out, t = [], 0.0
    for i, gap in enumerate(interarrival_gaps(n, rate, burstiness, rng)):
        if i:
            t += gap
        out.append(t)
    return out
