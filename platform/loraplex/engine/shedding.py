"""Load shedding: an Engine replica refuses new work (503 + Retry-After) while its vLLM queue or
KV cache is past a threshold, instead of letting every request's latency grow without bound.

Lower priorities are shed first: a request of priority p (0..100, the tenant's `priority`
limit) is refused once the replica's waiting requests reach
`shed_waiting + (max_waiting - shed_waiting) * p / 100`, or its KV-cache usage reaches
`shed_kv_usage + (max_kv_usage - shed_kv_usage) * p / 100`. So while a low-priority tenant is
shed, a high-priority one is still admitted, up to the hard `max_*` bounds that hold for all.

The check runs on the replica the router picked (its least-loaded choice for the request), on
that replica's live numbers: no stale view from another process.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Optional

from pydantic import BaseModel, ConfigDict, Field, model_validator


class SheddingConfig(BaseModel):
    """When an Engine replica refuses new requests, by the tenant's priority."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(True, description="Refuse new work when the replica is overloaded.")
    shed_waiting: int = Field(
        16, ge=0, description="Requests waiting in vLLM's queue at which priority-0 requests are refused."
    )
    max_waiting: int = Field(
        64, ge=0, description="Waiting requests at which every request is refused (priority 100); "
        "priorities in between are refused at a linear share of the way.",
    )
    shed_kv_usage: float = Field(
        0.95, gt=0, le=1, description="KV-cache usage (0..1) at which priority-0 requests are refused."
    )
    max_kv_usage: float = Field(1.0, gt=0, le=1, description="KV-cache usage at which every request is refused.")
    retry_after_s: int = Field(2, ge=1, description="Retry-After of a shed request, in seconds.")
    sample_period_s: float = Field(
        0.25, gt=0, description="How long the replica reuses one reading of vLLM's queue and KV gauges."
    )

    @model_validator(mode="after")
    def _ordered(self) -> "SheddingConfig":
        if self.max_waiting < self.shed_waiting or self.max_kv_usage < self.shed_kv_usage:
            raise ValueError("max_waiting / max_kv_usage must be at least shed_waiting / shed_kv_usage")
        return self


@dataclass
class EngineLoad:
    waiting: float = 0.0
    kv_usage: float = 0.0


class LoadShedder:
    def __init__(self, config: SheddingConfig, read_load: Callable[[], EngineLoad]):
        self.config = config
        self.read_load = read_load
        self._load = EngineLoad()
        self._read_at = float("-inf")
        self.shed = 0  # requests refused, for the replica's counters

    def load(self) -> EngineLoad:
        now = time.monotonic()
        if now - self._read_at >= self.config.sample_period_s:
            self._load, self._read_at = self.read_load(), now
        return self._load

    def refusal(self, priority: int) -> Optional[str]:
        """Why a request of this priority is refused now, or None to admit it."""
        c = self.config
        if not c.enabled:
            return None
        share = min(max(priority, 0), 100) / 100
        load = self.load()
        waiting_limit = c.shed_waiting + (c.max_waiting - c.shed_waiting) * share
        kv_limit = c.shed_kv_usage + (c.max_kv_usage - c.shed_kv_usage) * share
        if load.waiting >= waiting_limit:
            reason = f"{load.waiting:.0f} requests are queued on this engine replica"
        elif load.kv_usage >= kv_limit:
            reason = f"its KV cache is {load.kv_usage:.0%} full"
        else:
            return None
        self.shed += 1
        return reason
