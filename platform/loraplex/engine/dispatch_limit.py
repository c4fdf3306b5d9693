"""AdaptiveLimit: the fair queue's dispatch limit, sized to the SLO by AIMD.

Each finished request reports the latency vLLM gave it (time to first token from vLLM's first
scheduling of it, and time per output token). Every `window` such reports the limit is judged,
or sooner, `window_s` into a window that holds a report per slot:
more than `slow_share` of them over a target (the p95 objectives) -> multiply the limit by
`backoff` (at least `min_limit`); otherwise, if the limit was reached during the window (there was more
work than slots), add 1 (at most max_num_seqs), or double it until the first lowering (`slow_start`). Queue wait is left out on purpose: it is the
fair queue's doing, and counting it would shrink the limit exactly when a backlog needs slots;
the caller measures TTFT from when vLLM first scheduled the request, so vLLM's own waiting
queue is left out too (it only grows when the limit is already too high, which TPOT shows).
"""

from __future__ import annotations

import math
import time
from typing import Callable, Optional

from loraplex.config import AdaptiveLimitConfig  # noqa: F401, E402  (config models live in loraplex/config.py)


class AdaptiveLimit:
    def __init__(self, config: AdaptiveLimitConfig, max_limit: int, ttft_s: float, tpot_s: float,
                 clock: Callable[[], float] = time.monotonic):
        self.config = config
        self.clock = clock
        self.max_limit = max_limit
        self.ttft_s = config.ttft_s or ttft_s
        self.tpot_s = config.tpot_s or tpot_s
        self.min_limit = min(config.min_limit, max_limit)
        self.value = min(max(config.initial, self.min_limit), max_limit)
        self._seen = self._slow = 0
        self._saturated = False
        self._starting = config.slow_start  # doubling until the first lowering
        self._window_started = clock()

    def __call__(self) -> int:
        return self.value

    def saw_full(self) -> None:
        """The limit was reached (a request had to queue): there is demand for more slots."""
        self._saturated = True

    def observe(self, ttft_s: Optional[float], tpot_s: Optional[float]) -> bool:
        """One finished request's latencies (None: not measured); True if the limit changed."""
        if ttft_s is None and tpot_s is None:
            return False
        self._seen += 1
        if (ttft_s is not None and ttft_s > self.ttft_s) or (tpot_s is not None and tpot_s > self.tpot_s):
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

    def observe(self, ttft_s, tpot_s) -> bool:
        return False
