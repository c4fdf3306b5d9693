from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal

from sqlalchemy import Engine

from loraplex.accounting import render
from loraplex.accounting.pricing import PriceBook
from loraplex.accounting.usage_query import usage_totals

COLUMNS = ("prompt_tokens", "cached_prompt_tokens", "completion_tokens", "requests", "cost")
# Grouped by adapter, the requests on the base model alone (no adapter) are this row: a name no
# adapter can have (registry.store.NAME starts with a letter or digit), not an empty cell.
BASE_MODEL_ROW = "(base)"


@dataclass
class UsageRow:
    key: str | None
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    completion_tokens: int = 0
    requests: int = 0
    cost: Decimal = Decimal(0)

    def add(self, other: "UsageRow") -> None:
        self.prompt_tokens += other.prompt_tokens
        self.cached_prompt_tokens += other.cached_prompt_tokens
        self.completion_tokens += other.completion_tokens
        self.requests += other.requests
        self.cost += other.cost

    def to_dict(self, key_name: str) -> dict:
        # Money as a string: JSON numbers are floats to most clients.
        return {key_name: self.key, **{c: getattr(self, c) for c in COLUMNS[:-1]}, "cost": str(self.cost)}


@dataclass
class UsageReport:
    tenant_id: str | None  # None: all tenants
    start: datetime
    end: datetime
    group_by: str
    currency: str
    rows: list[UsageRow] = field(default_factory=list)
    total: UsageRow = field(default_factory=lambda: UsageRow(key=None))
    # Grouped by tenant: each row's tenant name next to its id (`tenant_name`), from this map.
    tenant_names: dict[str, str] = field(default_factory=dict)

    @property
    def by_tenant(self) -> bool:
        return self.group_by == "tenant"

    def to_dict(self) -> dict:
        rows = [r.to_dict(self.group_by) for r in self.rows]
        if self.by_tenant:
            rows = [{"tenant": row["tenant"], "tenant_name": self.tenant_names.get(row["tenant"]), **row} for row in rows]
        return {"tenant": self.tenant_id, "start": self.start.isoformat(), "end": self.end.isoformat(),
                "group_by": self.group_by, "currency": self.currency, "rows": rows,
                "total": {k: v for k, v in self.total.to_dict(self.group_by).items() if k != self.group_by}}

    def to_csv(self) -> str:
        return render.csv_text(self._header(), [self._cells(r) for r in self.rows])

    def to_table(self) -> str:
        total = self._cells(self.total)
        total[0] = "TOTAL"
        if self.by_tenant:
            total[1] = ""
        return render.text_table(self._header(), [self._cells(r) for r in self.rows], footer=total)

    def _header(self) -> list[str]:
        return [self.group_by, *(["tenant_name"] if self.by_tenant else []), *COLUMNS]

    def _cells(self, r: UsageRow) -> list:
        name = [self.tenant_names.get(r.key or "", "")] if self.by_tenant else []
        return [r.key or "", *name, r.prompt_tokens, r.cached_prompt_tokens, r.completion_tokens, r.requests,
                str(r.cost)]


def usage_report(engine: Engine, prices: PriceBook, start: datetime, end: datetime, group_by: str = "day",
                 tenant_id: str | None = None, tenant_names: dict[str, str] | None = None) -> UsageReport:
    """Usage and cost over [start, end) (by finish_time) for one tenant or all, one row per group
    (by tenant: with each tenant's name from `tenant_names`, id -> name)."""
    with engine.connect() as conn:
        totals = usage_totals(conn, start, end, group_by, tenant_id)
    report = UsageReport(tenant_id, start, end, group_by, prices.currency, tenant_names=dict(tenant_names or {}))
    rows: dict[str | None, UsageRow] = {}
    for t in totals:
        part = UsageRow(t.key, t.prompt_tokens, t.cached_prompt_tokens, t.completion_tokens, t.requests,
                        prices.cost(t.tenant_id, t.prompt_tokens, t.cached_prompt_tokens, t.completion_tokens, t.batch,
                                    t.base_model))
        rows.setdefault(t.key, UsageRow(t.key)).add(part)
        report.total.add(part)
    report.rows = sorted(rows.values(), key=lambda r: (r.key is not None, r.key or ""))
    if group_by == "adapter" and None in rows:
        rows[None].key = BASE_MODEL_ROW  # sorted first, as the row without an adapter
    return report
