"""What the run's usage ledger says of the requests a scenario sent."""

from __future__ import annotations

import time


def replica_of(database_url: str, request_ids: list[str], timeout_s: float = 30) -> dict[str, str]:
    """request id -> the Engine replica that served it, once every record is flushed (or after timeout_s)."""
    from sqlalchemy import select

    from loraplex.accounting.tables import usage_records
    from loraplex.db.engine import make_engine

    db, deadline = make_engine(database_url), time.time() + timeout_s
    try:
        while True:
            with db.connect() as conn:
                rows = dict(conn.execute(select(usage_records.c.request_id, usage_records.c.replica_id)
                                         .where(usage_records.c.request_id.in_(request_ids))).all())
            if len(rows) >= len(request_ids) or time.time() > deadline:
                return rows
            time.sleep(0.5)
    finally:
        db.dispose()
