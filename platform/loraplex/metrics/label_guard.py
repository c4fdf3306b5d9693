"""LabelGuard: the cardinality guard on `tenant` and `adapter` label values.

Each distinct label value is a series per metric (per bucket, for a histogram), and Prometheus's
cost grows with series. The guard lets at most `limit` keys keep their own value; the rest are
reported as `other`.

Which keys: while slots are free, every new key gets one (a deployment with up to `limit` active
tenants labels them all from their first request). Once full, keys without a slot count under
`other`, and every `window_s` the slots go to the busiest keys by weight (tokens) in the window
just ended; keys that still fit keep their slot first (ties), idle slots stay with their keys
when nobody under `other` was busy. A key that loses its slot keeps its old series (Ray's
exporter keeps every counter series it has seen: they are cumulative), so at any time at most
`limit` keys plus `other` gain counts, and a longer window means fewer re-rankings.

No lock: one event loop calls it (an Engine or Ingress replica's request path); dict updates.
"""

from __future__ import annotations

import heapq
import time
from typing import Callable


class LabelGuard:
    def __init__(self, limit: int, window_s: float = 3600.0, clock: Callable[[], float] = time.monotonic):
        if limit < 1:
            raise ValueError("limit must be at least 1")
        self.limit = limit
        self.window_s = window_s
        self.clock = clock
        self.kept: set[str] = set()
        self.weights: dict[str, int] = {}  # this window's weight per key
        self.overflow = 0  # this window's weight of keys reported as `other`
        self.rerank_at = clock() + window_s

    def keep(self, key: str, weight: int = 0) -> bool:
        """Count `weight` for `key`; True if the key keeps its own label value now."""
        weights = self.weights
        weights[key] = weights.get(key, 0) + weight
        if key in self.kept:
            return True
        if len(self.kept) < self.limit:
            self.kept.add(key)
            return True
        if self.clock() >= self.rerank_at:
            self._rerank()
            if key in self.kept:
                return True
        self.overflow += weight
        return False

    def _rerank(self) -> None:
        if self.overflow > 0:  # someone under `other` was busy: the busiest keys take the slots
            kept = self.kept
            top = heapq.nlargest(self.limit, self.weights.items(), key=lambda kv: (kv[1], kv[0] in kept))
            ranked = {k for k, w in top if w > 0}
            # Slots nobody busy claimed stay with their keys (fewer series).
            for k in kept:
                if len(ranked) >= self.limit:
                    break
                ranked.add(k)
            self.kept = ranked
        self.weights = {}
        self.overflow = 0
        self.rerank_at = self.clock() + self.window_s
