"""The one aggregation every report, statement and export is built from."""
from dataclasses import dataclass
from datetime import datetime

from typing import Optional

from sqlalchemy import Connection, Engine, case, func, select

from loraplex.accounting.period import check_range
from loraplex.accounting.tables import usage_records as u

GROUP_BY = ("day", "hour", "adapter", "model", "tenant", "batch")


def tokens_since(db: Engine, tenant_id: str, since: datetime, request_ids: list[str], *,
                 base_model: Optional[str] = None, batch_only: bool = False) -> tuple[float, set[str]]:
    """(prompt + completion tokens of the tenant's records finished since `since`, only those on
    `base_model` / only batch lines if asked; which of `request_ids` the ledger has), for the limits
    that count what the ledger holds plus what is still in flight. The ids are read first: a record
    landing in between is then counted twice for one read (holds back early), never zero times
    (lets too much through)."""
    with db.connect() as conn:
        present: set[str] = set()
        for i in range(0, len(request_ids), 500):
            chunk = request_ids[i:i + 500]
            present |= set(conn.execute(select(u.c.request_id).where(u.c.request_id.in_(chunk))).scalars())
        query = (select(func.coalesce(func.sum(u.c.prompt_tokens + u.c.completion_tokens), 0))
                 .where(u.c.tenant_id == tenant_id, u.c.finish_time >= since))
        if base_model is not None:
            query = query.where(u.c.base_model == base_model)
        if batch_only:
            query = query.where(u.c.batch.is_(True))
        total = conn.execute(query).scalar()
    return float(total or 0), present


@dataclass
class UsageTotals:
    tenant_id: str
    key: str | None  # the group's value: "2026-11-29", "2026-11-29T22:00:00Z", adapter, model
    prompt_tokens: int
    cached_prompt_tokens: int
    completion_tokens: int
    requests: int
    batch: bool = False  # Batch API lines' (priced at the batch price): totals are split by it
    base_model: str = ""  # the records' base model: totals are split by it too (bases may differ in price)


def group_key(conn: Connection, group_by: str):
    if group_by in ("day", "hour"):
        if conn.dialect.name == "postgresql":
            fmt = "YYYY-MM-DD" if group_by == "day" else 'YYYY-MM-DD"T"HH24:00:00"Z"'
            return func.to_char(func.date_trunc(group_by, u.c.finish_time), fmt)
        return func.strftime("%Y-%m-%d" if group_by == "day" else "%Y-%m-%dT%H:00:00Z", u.c.finish_time)
    if group_by == "adapter":
        return u.c.adapter
    if group_by == "model":
        return u.c.base_model
    if group_by == "tenant":
        return u.c.tenant_id
    if group_by == "batch":  # online and Batch API usage apart
        return case((u.c.batch, "batch"), else_="online")
    raise ValueError(f"group_by must be one of {GROUP_BY}")


def usage_totals(conn: Connection, start: datetime, end: datetime, group_by: str,
                 tenant_id: str | None = None) -> list[UsageTotals]:
    """Sums per (tenant, group) of records whose finish_time is in [start, end).

    Always split by tenant, base model and batch too: prices are per tenant and per base, and
    batch lines have their own, so cost is computed per (tenant, base model, batch) and summed.
    """
    check_range(start, end)
    key = group_key(conn, group_by).label("key")
    q = (select(u.c.tenant_id, key, func.sum(u.c.prompt_tokens), func.sum(u.c.cached_prompt_tokens),
                func.sum(u.c.completion_tokens), func.count(), u.c.batch, u.c.base_model)
         .where(u.c.finish_time >= start, u.c.finish_time < end)
         .group_by(u.c.tenant_id, key, u.c.base_model, u.c.batch)
         .order_by(key, u.c.tenant_id, u.c.base_model, u.c.batch))
    if tenant_id is not None:
        q = q.where(u.c.tenant_id == tenant_id)
    return [UsageTotals(t, k, int(p), int(c), int(o), int(n), bool(b), m)
            for t, k, p, c, o, n, b, m in conn.execute(q)]
