"""Load shedding: an Engine replica refuses new work (503 + Retry-After) while it holds too many
sequences or its KV cache is nearly full, instead of letting every request's latency grow. It
refuses the tenant over its share, never the one under it.

The replica is full for a request of priority p (0..100, the tenant's `priority` limit) once its
sequences in flight (running + waiting in vLLM; a request of `n` choices or a list of prompts is
n x prompts of them, EngineCall.sequences) reach `shed_requests + (max_requests - shed_requests) *
p / 100`, or its KV-cache usage reaches `shed_kv_usage + (max_kv_usage - shed_kv_usage) * p / 100`
(`requests_by_priority` replaces the straight line by points). A full replica still admits a
tenant whose sequences there, this request's included, stay within its share: the sequences that
fill it (the count at which p is refused, or what is in flight when the KV cache is what is full)
less those of higher-priority tenants, split by weight over the tenants of its own priority holding
sequences there and this one (at least 1 while any room is left, so a tenant with nothing there
gets one in). So one tenant's flood is refused while its neighbours are served, and a priority
ladder still refuses a low priority once higher ones fill its count. Past the bounds that hold for
all (the top priority's count, max_kv_usage) every request is refused.

The check runs on the replica the router picked (its least-loaded choice for the request), on
that replica's live count of its own sequences: no stale view from another process.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from loraplex.engine.config import SheddingConfig


@dataclass
class InFlight:
    """The sequences a replica serves (in vLLM or about to be; not queued), in all and per tenant
    with the tenant's weight and priority (its latest request's)."""

    total: int = 0
    sequences: dict[str, int] = field(default_factory=dict)
    weights: dict[str, float] = field(default_factory=dict)
    priorities: dict[str, int] = field(default_factory=dict)

    def add(self, tenant: str, weight: float, n: int, priority: int = 0) -> None:
        self.total += n
        self.sequences[tenant] = self.sequences.get(tenant, 0) + n
        self.weights[tenant] = weight
        self.priorities[tenant] = priority

    def remove(self, tenant: str, n: int) -> None:
        self.total -= n
        left = self.sequences.get(tenant, 0) - n
        if left > 0:
            self.sequences[tenant] = left
        else:
            self.sequences.pop(tenant, None)
            self.weights.pop(tenant, None)
            self.priorities.pop(tenant, None)

    def share(self, tenant: str, weight: float, priority: int, of: float) -> int:
        """The tenant's share of `of` sequences: what higher priorities hold leaves it, the rest
        is split by weight over the tenants of this priority holding some and this one (at least
        1 while any is left)."""
        room = of - sum(n for t, n in self.sequences.items() if t != tenant and self.priorities[t] > priority)
        if room <= 0:
            return 0
        peers = sum(w for t, w in self.weights.items() if t != tenant and self.priorities[t] == priority)
        return max(1, int(room * weight / max(peers + weight, 1e-9)))


class LoadShedder:
    def __init__(self, config: SheddingConfig, in_flight: InFlight, read_kv_usage: Callable[[], float]):
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

    def refusal(self, tenant: str, priority: int, weight: float = 1.0, sequences: int = 1) -> Optional[str]:
        """Why this tenant's request (of `sequences`) is refused now, or None to admit it."""
        c = self.config
        if not c.enabled:
            return None
        level = min(max(priority, 0), 100) / 100
        total, kv = self.in_flight.total, self.kv_usage()
        full_at = c.requests_limit(priority)
        if total >= full_at:
            reason = f"{total} sequences are in flight on this engine replica"
        elif kv >= c.shed_kv_usage + (c.max_kv_usage - c.shed_kv_usage) * level:
            reason, full_at = f"its KV cache is {kv:.0%} full", total
        else:
            return None
        held = self.in_flight.sequences.get(tenant, 0)
        share = self.in_flight.share(tenant, weight, priority, full_at)
        if held + sequences <= share and total + sequences <= c.requests_limit(100) and kv < c.max_kv_usage:
            return None  # under its share: the tenants over theirs are the ones refused
        self.shed += 1
        return f"{reason}, and your tenant would hold {held + sequences} of them, over its share of {share}"
