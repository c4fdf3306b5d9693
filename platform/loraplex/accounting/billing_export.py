"""Billing events for a month: one CloudEvent per tenant x base model x meter x UTC day.

Event ids are uuid5(tenant|meter|period|day), so a re-export yields the same ids and billing
systems that de-duplicate on id (Stripe `identifier`, OpenMeter/Lago `id`/`transaction_id`)
ingest it idempotently. Because the id does not change, a day is exported only once it is
final: `grace` after the day ends (longer than any spool replay delay).

A tenant's day on two or more base models has one event per base and meter, and those ids take
the model too: uuid5(tenant|model|meter|period|day). A day on one base keeps the id without it,
so the ids of every day a single-base deployment exported before bases were metered apart stay
the same (a re-export of such a month does not bill it twice). Which form a day's ids have is
fixed with the day: both are decided only once it is final.
"""
import json
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

from sqlalchemy import Engine

from loraplex.accounting import render
from loraplex.accounting.period import period_bounds
from loraplex.accounting.pricing import METERS, billed_quantities  # noqa: F401  (METERS: re-exported)
from loraplex.accounting.usage_query import usage_totals

# Fixed forever: changing it changes every event id.
EVENT_NAMESPACE = uuid.UUID("6f1c8c1e-3d0b-5b7a-9a57-4c6f5241504c")
EVENT_TYPE = "io.loraplex.usage.tokens"
# `model` last: a consumer reading columns by position before it existed reads the same ones.
CSV_COLUMNS = ["id", "time", "tenant", "meter", "quantity", "period", "day", "model"]


def event_id(tenant_id: str, meter: str, period: str, day: str, model: str | None = None) -> str:
    """model: the base model, only for a tenant's day on several bases (see the module's doc)."""
    key = f"{tenant_id}|{meter}|{period}|{day}" if model is None else f"{tenant_id}|{model}|{meter}|{period}|{day}"
    return str(uuid.uuid5(EVENT_NAMESPACE, key))


@dataclass
class BillingExport:
    period: str
    complete: bool           # every day of the period is final and included
    through: str | None      # last day included ("YYYY-MM-DD"), None if none yet
    events: list[dict] = field(default_factory=list)

    def to_jsonl(self) -> str:
        return "".join(json.dumps(e, separators=(",", ":"), sort_keys=True) + "\n" for e in self.events)

    def to_csv(self) -> str:
        rows = [[e["id"], e["time"], e["subject"], e["data"]["meter"], e["data"]["quantity"], self.period,
                 e["data"]["day"], e["data"]["model"]] for e in self.events]
        return render.csv_text(CSV_COLUMNS, rows)


def billing_export(engine: Engine, period: str, *, source: str = "loraplex", now: datetime | None = None,
                   grace: timedelta = timedelta(hours=1), tenant_id: str | None = None) -> BillingExport:
    start, end = period_bounds(period)
    now = now or datetime.now(timezone.utc)
    # Days [start, closed_end) are final; export nothing of a day still receiving records.
    closed_end = min(end, (now - grace).replace(hour=0, minute=0, second=0, microsecond=0))
    export = BillingExport(period, complete=closed_end >= end, through=None)
    if closed_end <= start:
        return export
    export.through = (closed_end - timedelta(days=1)).date().isoformat()
    with engine.connect() as conn:
        totals = usage_totals(conn, start, closed_end, "day", tenant_id)
    models_of_day: dict[tuple[str, str], set[str]] = {}  # (tenant, day) -> the bases it used
    for t in totals:
        models_of_day.setdefault((t.tenant_id, t.key), set()).add(t.base_model)
    for t in sorted(totals, key=lambda t: (t.tenant_id, t.key, t.base_model)):
        # A Batch API line's tokens are the batch_* meters: their own events (and ids) beside the online ones.
        quantities = billed_quantities(t.prompt_tokens, t.cached_prompt_tokens, t.completion_tokens, t.batch)
        day_start = datetime.fromisoformat(t.key).replace(tzinfo=timezone.utc)
        id_model = t.base_model if len(models_of_day[(t.tenant_id, t.key)]) > 1 else None
        for meter in quantities:
            if quantities[meter] == 0:
                continue
            export.events.append({
                "specversion": "1.0",
                "id": event_id(t.tenant_id, meter, period, t.key, id_model),
                "source": source,
                "type": EVENT_TYPE,
                "subject": t.tenant_id,
                # The usage window's start: billing systems bucket by event time.
                "time": day_start.isoformat().replace("+00:00", "Z"),
                "datacontenttype": "application/json",
                "data": {"meter": meter, "quantity": quantities[meter], "tenant": t.tenant_id,
                         "model": t.base_model, "period": period, "day": t.key,
                         "window_start": day_start.isoformat().replace("+00:00", "Z"),
                         "window_end": (day_start + timedelta(days=1)).isoformat().replace("+00:00", "Z")},
            })
    return export
