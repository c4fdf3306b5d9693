"""The usage ledger as a load-test trace: one JSONL line per finished request, with its tenant,
adapter, real prompt and completion token counts and arrival offset (no text: the ledger keeps
none; the load test cuts prompts of those lengths from real text).

    python -m bench.loadtest.trace_export --database-url sqlite:///var/loraplex.db \
        --start 2026-11-01 --end 2026-12-01 > trace.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime, timezone
from typing import Iterator, Optional

from sqlalchemy import Engine, select

from loraplex.accounting.tables import usage_records as u

STATUSES = ("finished", "stop", "length")  # requests that ran to their end (not aborted / failed)


def export_trace(engine: Engine, start: Optional[datetime] = None, end: Optional[datetime] = None,
                 tenant: Optional[str] = None, all_statuses: bool = False) -> Iterator[dict]:
    q = select(u.c.tenant_id, u.c.adapter, u.c.prompt_tokens, u.c.cached_prompt_tokens, u.c.completion_tokens,
               u.c.arrival_time, u.c.status).order_by(u.c.arrival_time, u.c.request_id)
    if start is not None:
        q = q.where(u.c.arrival_time >= start)
    if end is not None:
        q = q.where(u.c.arrival_time < end)
    if tenant is not None:
        q = q.where(u.c.tenant_id == tenant)
    if not all_statuses:
        q = q.where(u.c.status.in_(STATUSES))
    t0 = None
    with engine.connect() as conn:
        for tenant_id, adapter, prompt, cached, completion, arrival, status in conn.execute(q):
            if completion <= 0:
                continue
            t = arrival.timestamp()
            t0 = t if t0 is None else t0
            yield {"tenant": tenant_id, "adapter": _adapter_name(adapter), "prompt_tokens": prompt,
                   "cached_prompt_tokens": cached, "completion_tokens": completion,
                   "arrival_s": round(t - t0, 6), "status": status}


def _adapter_name(stored: Optional[str]) -> Optional[str]:
    """The ledger keeps `name@version`; a trace names the adapter per tenant, without version."""
    if not stored:
        return None
    return stored.split("/", 1)[-1].split("@", 1)[0]


def _when(text: Optional[str]) -> Optional[datetime]:
    if not text:
        return None
    d = datetime.fromisoformat(text)
    return d if d.tzinfo else d.replace(tzinfo=timezone.utc)


def main(argv=None) -> int:
    from loraplex.db.engine import DEFAULT_DB_URL, make_engine

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--database-url", default=DEFAULT_DB_URL)
    ap.add_argument("--start", help="ISO date/time (UTC unless it says): requests that arrived from then")
    ap.add_argument("--end", help="ISO date/time: requests that arrived before then")
    ap.add_argument("--tenant")
    ap.add_argument("--all-statuses", action="store_true", help="also aborted / failed requests")
    ap.add_argument("--out", help="file (default stdout)")
    a = ap.parse_args(argv)
    out = open(a.out, "w") if a.out else sys.stdout
    n = 0
    for rec in export_trace(make_engine(a.database_url), _when(a.start), _when(a.end), a.tenant, a.all_statuses):
        out.write(json.dumps(rec) + "\n")
        n += 1
    if a.out:
        out.close()
    print(f"{n} requests", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
