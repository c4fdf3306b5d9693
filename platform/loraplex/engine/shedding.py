"""Load shedding: an Engine replica refuses new work (503 + Retry-After) while it holds too many
requests or its KV cache is nearly full, instead of letting every request's latency grow.

Lower priorities are shed first: a request of priority p (0..100, the tenant's `priority`
limit) is refused once the replica's sequences in flight (running + waiting in vLLM; a request
of `n` choices or a list of prompts is n x prompts of them, EngineCall.sequences) reach
`shed_requests + (max_requests - shed_requests) * p / 100`, or its KV-cache usage reaches
`shed_kv_usage + (max_kv_usage - shed_kv_usage) * p / 100`. So while a low-priority tenant is
shed, a high-priority one is still admitted (and scheduled first by vLLM's priority policy),
up to the hard `max_*` bounds that hold for all. `requests_by_priority` replaces the straight
line by points (priority -> requests in flight), for a ladder that sheds the middle priorities
early while the top one keeps a deep queue.

The check runs on the replica the router picked (its least-loaded choice for the request), on
that replica's live count of its own requests: no stale view from another process.
"""

from __future__ import annotations

import time
from bisect import bisect_right
from typing import Callable, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from loraplex.config import SheddingConfig  # noqa: F401, E402  (config models live in loraplex/config.py)


class LoadShedder:
    def __init__(self, config: SheddingConfig, in_flight: Callable[[], int], read_kv_usage: Callable[[], float]):
        self.config = config
        self.in_flight = in_flight  # exact and cheap: the sequences the replica has in vLLM
        self.read_kv_usage = read_kv_usage  # a gauge scrape: sampled
        self._kv_usage = 0.0
        self._read_at = float("-inf")
        self.shed = 0  # requests refused, for the replica's counters

    def kv_usage(self) -> float:
        now = time.monotonic()
        if now - self._read_at >= self.config.sample_period_s:
            self._kv_usage, self._read_at = self.read_kv_usage(), now
        return self._kv_usage

    def refusal(self, priority: int) -> Optional[str]:
        """Why a request of this priority is refused now, or None to admit it."""
        c = self.config
        if not c.enabled:
            return None
        share = min(max(priority, 0), 100) / 100
        in_flight = self.in_flight()
        if in_flight >= c.requests_limit(priority):
            reason = f"{in_flight} sequences are in flight on this engine replica"
        elif (kv := self.kv_usage()) >= c.shed_kv_usage + (c.max_kv_usage - c.shed_kv_usage) * share:
            reason = f"its KV cache is {kv:.0%} full"
        else:
            return None
        self.shed += 1
        return reason
