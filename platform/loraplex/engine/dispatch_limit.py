"""AdaptiveLimit: the fair queue's dispatch limit, sized to the SLO by AIMD.

Each finished request reports its time per output token (TPOT) in vLLM. Every `window` such
reports the limit is judged, or sooner, `window_s` into a window that holds a report per slot:
more than `slow_share` of them over the target (the p95 objective) -> multiply the limit by
`backoff` (at least `min_limit`); otherwise, if the limit was reached during the window (there
was more work than slots), add 1 (at most max_num_seqs), or double it until the first lowering
(`slow_start`).

Only TPOT, because it is the latency the batch size sets: each decode step carries every
dispatched request. Time to first token is not the limit's to fix. While requests queue, a
smaller limit only moves their wait from vLLM's prefill into this queue, and the queue wait is
part of the TTFT a client sees: one tenant with 16 requests in flight lost half its goodput to
a limit that backed off on vLLM-side TTFT misses (docs/benchmarks.md). Those misses come from
prompts prefilled together (a closed loop's requests end and refill together), which prefill
pacing (`max_prefilling_per_tenant`) and capacity address. The queue wait itself is left out
too: counting it would shrink the limit exactly when a backlog needs slots.
"""

from __future__ import annotations

import math
import time
from typing import Callable, Optional

from loraplex.engine.config import AdaptiveLimitConfig


class AdaptiveLimit:
    def __init__(self, config: AdaptiveLimitConfig, max_limit: int, tpot_s: float,
                 clock: Callable[[], float] = time.monotonic):
        self.config = config
        self.clock = clock
        self.max_limit = max_limit
        self.tpot_s = config.tpot_s or tpot_s
        self.min_limit = min(config.min_limit, max_limit)
        self.value = min(max(config.initial or max_limit, self.min_limit), max_limit)
        self._seen = self._slow = 0
        self._saturated = False
        self._starting = config.slow_start  # doubling until the first lowering
        self._window_started = clock()

    def __call__(self) -> int:
        return self.value

    def saw_full(self) -> None:
        """The limit was reached (a request had to queue): there is demand for more slots."""
        self._saturated = True

    def observe(self, tpot_s: Optional[float]) -> bool:
        """One finished request's time per output token (None: fewer than two tokens, not
        measured); True if the limit changed."""
        if tpot_s is None:
            return False
        self._seen += 1
        if tpot_s > self.tpot_s:
            self._slow += 1
        timed_out = (self.config.window_s is not None and self._seen >= min(self.config.window, self.value)
                     and self.clock() - self._window_started >= self.config.window_s)
        if self._seen < self.config.window and not timed_out:
            return False
        before = self.value
        if self._slow > self.config.slow_share * self._seen:
            self.value = max(self.min_limit, math.floor(self.value * self.config.backoff))
            self._starting = False
        elif self._saturated:
            self.value = min(self.max_limit, self.value * 2 if self._starting else self.value + 1)
        self._seen = self._slow = 0
        self._saturated = False
        self._window_started = self.clock()
        return self.value != before


class FixedLimit:
    def __init__(self, value: int):
        self.value = value

    def __call__(self) -> int:
        return self.value

    def saw_full(self) -> None:
        pass

    def observe(self, tpot_s) -> bool:
        return False
