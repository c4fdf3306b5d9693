"""Requests refused before the engine (401/404/429/...): counted in memory per tenant, reason and
UTC hour (RejectionCounter, drained by the ledger into the spool), and read back from the
ledger's usage_rejections table (rejection_counts). Never billed."""

import threading
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timezone

from sqlalchemy import Engine, func, select

from loraplex.accounting.period import check_range
from loraplex.accounting.tables import usage_rejections as r

UNKNOWN_TENANT = "-"  # 401s: no key, so no tenant to attribute to


class RejectionCounter:
    """In-memory counts of requests refused before the engine (401/404/429/...), per tenant,
    reason and UTC hour. Never billable; the ledger drains it into the spool on each flush, so a
    crash loses at most one flush interval of these counts (they are diagnostics, not money)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._counts: Counter[tuple[str, str, str]] = Counter()

    def add(self, tenant_id: str | None, reason: str, at: datetime | None = None, n: int = 1) -> None:
        at = (at or datetime.now(timezone.utc)).astimezone(timezone.utc)
        hour = at.replace(minute=0, second=0, microsecond=0).isoformat()
        with self._lock:
            self._counts[(tenant_id or UNKNOWN_TENANT, reason, hour)] += n

    def drain(self) -> list[list]:
        with self._lock:
            counts, self._counts = self._counts, Counter()
        return [[t, r, h, n] for (t, r, h), n in sorted(counts.items())]


@dataclass
class RejectionCount:
    tenant_id: str
    reason: str
    count: int


def rejection_counts(engine: Engine, start: datetime, end: datetime, tenant_id: str | None = None) -> list[RejectionCount]:
    """Requests refused before the engine in [start, end) (hour resolution), by tenant and reason."""
    check_range(start, end)
    q = (select(r.c.tenant_id, r.c.reason, func.sum(r.c.count))
         .where(r.c.hour >= start, r.c.hour < end)
         .group_by(r.c.tenant_id, r.c.reason).order_by(r.c.tenant_id, r.c.reason))
    if tenant_id is not None:
        q = q.where(r.c.tenant_id == tenant_id)
    with engine.connect() as conn:
        return [RejectionCount(t, reason, int(n)) for t, reason, n in conn.execute(q)]
