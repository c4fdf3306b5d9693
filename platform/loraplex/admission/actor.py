"""LimiterActor: one shard's `LimiterCore` in a small Ray actor (num_cpus=0), shared by every
ingress replica. It also reads the ledger's month-to-date totals for budgets (cached
`budget_cache_s` per tenant, refreshed in the background, never blocking other tenants).

When a read fails (the database is down) the actor counts it (loraplex_budget_source_failures_total),
tries again after budget_cache_s, and applies `on_unavailable`: "open" (default) goes on from the
last read (a tenant never read this month: its budget is not enforced until a read succeeds);
"closed" answers the tenant's acquires `unavailable` (the ingress refuses with 503 + Retry-After)
until a read succeeds."""

from __future__ import annotations

import asyncio
import logging
import time

from loraplex.admission.budget_source import month_to_date
from loraplex.admission.core import LimiterCore, Refusal, month_start, split_key

logger = logging.getLogger(__name__)


class LimiterActor:
    def __init__(self, database_url: str | None, budget_cache_s: float = 5.0, holder_ttl_s: float = 30.0,
                 on_unavailable: str = "open", budget_source=month_to_date, metrics_sink=None):
        self.core = LimiterCore(holder_ttl_s=holder_ttl_s)
        self.database_url = database_url
        self.budget_cache_s = budget_cache_s
        self.on_unavailable = on_unavailable
        # (db, tenant, month, request ids, base model or None) -> (total, ids in the ledger)
        self.budget_source = budget_source
        self._db = None
        self._reads: dict[str, asyncio.Task] = {}
        self.failed_at: dict[str, float] = {}  # tenant -> when its last read failed (cleared by a good one)
        self.failures = _failures_counter(metrics_sink)

    def ready(self) -> str:
        return self.core.epoch

    def configure(self, database_url: str | None, budget_cache_s: float, on_unavailable: str) -> None:
        """The settings of the ingress replicas calling now. The actor is detached and outlives a
        `serve deploy` that changes them (its constructor runs only when it is first created), so
        every replica sends its own when it first looks the actor up; the limits' state stays."""
        if database_url != self.database_url:
            self.database_url, self._db = database_url, None  # the next budget read opens the new one
        self.budget_cache_s, self.on_unavailable = budget_cache_s, on_unavailable

    async def acquire(self, tenant: str, holder: str, limits: dict, need: dict, want: dict,
                      deadline: float | None = None):
        if "budget" in limits:
            await self._budget(tenant, limits["budget"])
            if self.on_unavailable == "closed" and tenant in self.failed_at:
                return {"unavailable": "the monthly budget's usage cannot be read (database unavailable)"}
        if deadline is not None and time.time() > deadline:
            return None  # the caller gave up waiting (and failed open): grant nothing it would leak
        result = self.core.acquire(tenant, holder, limits, need, want, time.monotonic(), time.time())
        if isinstance(result, Refusal):
            return {"epoch": self.core.epoch, "refused": result.code, "retry_after": result.retry_after,
                    "message": result.message}
        return result

    def give_back(self, tenant: str, holder: str, epoch: str, returned: dict, consumed: list) -> None:
        self.core.give_back(tenant, holder, epoch, returned, consumed, time.monotonic(), time.time())

    def touch(self, holder: str) -> None:
        self.core.touch(holder, time.monotonic())

    def stats(self) -> dict:
        return self.core.stats()

    async def _budget(self, tenant: str, limit: float) -> None:
        now = time.monotonic()
        if not self.core.budget_needs_read(tenant, now, self.budget_cache_s):
            return
        failed = self.failed_at.get(tenant)
        if failed is not None and now - failed < self.budget_cache_s:
            return  # failed moments ago: do not queue every admission behind another attempt
        task = self._reads.get(tenant)
        if task is None or task.done():
            task = self._reads[tenant] = asyncio.ensure_future(self._read(tenant, limit))
        if self.core.budget_read_never(tenant, now):
            await asyncio.shield(task)  # the first read of the month: nothing to go by yet
        # else: answer from the last read; the fresh one lands in the background

    async def _read(self, tenant: str, limit: float) -> None:
        if self.database_url is None:
            self.core.set_settled(tenant, month_start(time.time()), 0, set(), time.monotonic(), limit)
            return
        if self._db is None:
            from loraplex.db.engine import make_engine
            self._db = make_engine(self.database_url)
        month = month_start(time.time())
        ids = self.core.unsettled_ids(tenant)
        tenant_id, base_model = split_key(tenant)  # a per-base budget counts that base's records only
        try:
            total, present = await asyncio.to_thread(self.budget_source, self._db, tenant_id, month, ids, base_model)
        except Exception as exc:
            if tenant not in self.failed_at:
                logger.warning("limiter: reading the month-to-date usage of %s failed (%r); on_unavailable=%s: %s",
                               tenant, exc, self.on_unavailable, "admitting on the last read"
                               if self.on_unavailable == "open" else "refusing its requests with 503")
            self.failed_at[tenant] = time.monotonic()
            self.failures.inc(1)
            return  # open: keep the last read (or none: not enforced until a read succeeds)
        self.failed_at.pop(tenant, None)
        self.core.set_settled(tenant, month, total, present, time.monotonic(), limit)


def _failures_counter(sink):
    from loraplex.metrics import catalog
    from loraplex.metrics.sink import RaySink

    counter = (sink or RaySink(default_tags={})).make(catalog.BUDGET_SOURCE_FAILURES)
    counter.zero()  # the series exists at 0, so increase() sees the first failure
    return counter
