"""The ledger's month-to-date tokens of a tenant (or of a tenant on one base model), for
`monthly_token_budget`."""

from __future__ import annotations

from datetime import datetime
from typing import Optional

from sqlalchemy import Engine, func, select

from loraplex.accounting.tables import usage_records as u


def month_to_date(db: Engine, tenant_id: str, month: datetime, request_ids: list[str],
                  base_model: Optional[str] = None) -> tuple[float, set[str]]:
    """(prompt + completion tokens of the tenant's records finished since `month`, only those on
    `base_model` if given; which of `request_ids` the ledger has). The ids are read first: a record landing in between is then
    counted twice for one read (refuses early), never zero times (admits too much)."""
    with db.connect() as conn:
        present: set[str] = set()
        for i in range(0, len(request_ids), 500):
            chunk = request_ids[i:i + 500]
            present |= {r for (r,) in conn.execute(select(u.c.request_id).where(u.c.request_id.in_(chunk)))}
        query = (select(func.coalesce(func.sum(u.c.prompt_tokens + u.c.completion_tokens), 0))
                 .where(u.c.tenant_id == tenant_id, u.c.finish_time >= month))
        if base_model is not None:
            query = query.where(u.c.base_model == base_model)
        total = conn.execute(query).scalar()
    return float(total or 0), present
