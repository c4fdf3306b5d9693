from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Engine, func, select

from loraplex.accounting.period import check_range
from loraplex.accounting.tables import usage_rejections as r


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
