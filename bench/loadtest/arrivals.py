"""When requests are sent: closed loop (fixed concurrency) or open loop (Poisson / gamma arrivals,
or Poisson arrivals whose rate follows a profile that rises and falls: `RateProfile`).

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


# -- a rate that rises and falls -------------------------------------------------------------------
class RateProfile:
    """A request rate that changes over time: piecewise linear through `points` (seconds from the
    start, requests/s), 0 after the last point. Arrivals follow it as a Poisson process whose rate
    is the profile's at each instant (the load of a day, compressed: valleys and a peak)."""

    def __init__(self, points: list[tuple[float, float]]):
        if len(points) < 2 or points[0][0] != 0:
            raise ValueError("a rate profile needs at least two points, the first at t = 0")
        if any(b[0] <= a[0] for a, b in zip(points, points[1:])):
            raise ValueError("a rate profile's times must increase")
        if any(r < 0 for _, r in points):
            raise ValueError("a rate profile's rates must be >= 0 requests/s")
        self.points = [(float(t), float(r)) for t, r in points]

    @classmethod
    def rise_and_fall(cls, valley: float, peak: float, duration_s: float) -> "RateProfile":
        """A quarter at `valley`, up to `peak` at the middle, down to `valley` by three quarters,
        a quarter at `valley` again: valleys to fill, one peak."""
        q = duration_s / 4
        return cls([(0, valley), (q, valley), (2 * q, peak), (3 * q, valley), (duration_s, valley)])

    @property
    def duration_s(self) -> float:
        return self.points[-1][0]

    def rate(self, t: float) -> float:
        for (t0, r0), (t1, r1) in zip(self.points, self.points[1:]):
            if t0 <= t <= t1:
                return r0 + (r1 - r0) * (t - t0) / (t1 - t0)
        return 0.0

    def expected(self, t: float) -> float:
        """Expected arrivals in [0, t]: the rate's integral."""
        total = 0.0
        for (t0, r0), (t1, r1) in zip(self.points, self.points[1:]):
            if t <= t0:
                break
            end = min(t, t1)
            total += (r0 + self.rate(end)) / 2 * (end - t0)
        return total

    def time_of(self, n: float) -> float:
        """The t with expected(t) = n (inverse of `expected`); inf past the profile's total."""
        done = 0.0
        for (t0, r0), (t1, r1) in zip(self.points, self.points[1:]):
            seg = (r0 + r1) / 2 * (t1 - t0)
            if done + seg >= n and seg > 0:
                # Solve r0 x + s x^2 / 2 = left for x in [0, t1 - t0], s the segment's slope.
                left, s = n - done, (r1 - r0) / (t1 - t0)
                x = left / r0 if s == 0 else (-r0 + math.sqrt(max(r0 * r0 + 2 * s * left, 0.0))) / s
                return t0 + min(max(x, 0.0), t1 - t0)
            done += seg
        return math.inf


def profile_arrivals(profile: RateProfile, rng: random.Random | None = None) -> list[float]:
    """Send times (seconds from the start) of a Poisson process following `profile`: unit-rate
    Poisson arrivals mapped through the inverse of the expected count (time rescaling), so the same
    rng seed gives the same times, and the count is random with mean expected(duration)."""
    rng = rng or random.Random(0)
    out, n = [], 0.0
    while True:
        n += rng.expovariate(1.0)
        t = profile.time_of(n)
        if t > profile.duration_s:
            return out
        out.append(t)
