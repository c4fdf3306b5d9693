"""Load shedding: an Engine replica refuses new work (503 + Retry-After) while it holds too many
requests or its KV cache is nearly full, instead of letting every request's latency grow.

Lower priorities are shed first: a request of priority p (0..100, the tenant's `priority`
limit) is refused once the replica's requests in flight (running + waiting in vLLM) reach
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


class SheddingConfig(BaseModel):
    """When an Engine replica refuses new requests, by the tenant's priority."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(True, description="Refuse new work when the replica is overloaded.")
    shed_requests: int = Field(
        48, ge=0,
        description="Requests in flight on a replica (running + waiting in vLLM) at which "
        "priority-0 requests are refused. Above max_num_seqs they wait: this bounds the wait.",
    )
    max_requests: int = Field(
        128, ge=0, description="Requests in flight at which every request is refused (priority 100); "
        "priorities in between are refused at a linear share of the way.",
    )
    requests_by_priority: Optional[dict[int, int]] = Field(
        None,
        description="Requests in flight on a replica at which each listed priority is refused, "
        "e.g. {0: 1, 50: 2, 100: 8}: a priority between two listed ones is refused at the linear "
        "share of the way, one below the lowest or above the highest at that point's count. "
        "Replaces shed_requests / max_requests when set; counts may not fall as priority rises.",
    )
    shed_kv_usage: float = Field(
        0.95, gt=0, le=1, description="KV-cache usage (0..1) at which priority-0 requests are refused."
    )
    max_kv_usage: float = Field(1.0, gt=0, le=1, description="KV-cache usage at which every request is refused.")
    retry_after_s: int = Field(2, ge=1, description="Retry-After of a shed request, in seconds.")
    sample_period_s: float = Field(
        0.25, gt=0, description="How long the replica reuses one reading of vLLM's KV-usage gauge."
    )

    @field_validator("requests_by_priority")
    @classmethod
    def _ladder(cls, value: Optional[dict[int, int]]) -> Optional[dict[int, int]]:
        if value is None:
            return None
        if not value:
            raise ValueError("requests_by_priority needs at least one priority: count")
        if any(not 0 <= p <= 100 for p in value) or any(n < 0 for n in value.values()):
            raise ValueError("requests_by_priority: priorities are 0..100 and counts at least 0")
        counts = [value[p] for p in sorted(value)]
        if counts != sorted(counts):
            raise ValueError("requests_by_priority: a higher priority may not be refused at fewer requests "
                             f"in flight than a lower one (got {value})")
        return {p: value[p] for p in sorted(value)}  # in priority order: requests_limit bisects it

    def requests_limit(self, priority: int) -> float:
        """Requests in flight at which a request of this priority is refused."""
        p = min(max(priority, 0), 100)
        if self.requests_by_priority is None:
            return self.shed_requests + (self.max_requests - self.shed_requests) * p / 100
        ladder = self.requests_by_priority
        priorities = list(ladder)  # in order: the validator sorted them
        i = bisect_right(priorities, p)
        if i == 0 or i == len(priorities):
            return ladder[priorities[min(i, len(priorities) - 1)]]
        p0, p1 = priorities[i - 1], priorities[i]
        return ladder[p0] + (ladder[p1] - ladder[p0]) * (p - p0) / (p1 - p0)

    @model_validator(mode="after")
    def _ordered(self) -> "SheddingConfig":
        if self.max_requests < self.shed_requests or self.max_kv_usage < self.shed_kv_usage:
            raise ValueError("max_requests / max_kv_usage must be at least shed_requests / shed_kv_usage")
        return self


class LoadShedder:
    def __init__(self, config: SheddingConfig, in_flight: Callable[[], int], read_kv_usage: Callable[[], float]):
        self.config = config
        self.in_flight = in_flight  # exact and cheap: the engine's unfinished requests
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
            reason = f"{in_flight} requests are in flight on this engine replica"
        elif (kv := self.kv_usage()) >= c.shed_kv_usage + (c.max_kv_usage - c.shed_kv_usage) * share:
            reason = f"its KV cache is {kv:.0%} full"
        else:
            return None
        self.shed += 1
        return reason
