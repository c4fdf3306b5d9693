"""The budget's ledger read (SQLite and PostgreSQL) and the actor's use of it, without Ray."""

import asyncio
import sys
from datetime import datetime, timezone
from pathlib import Path

from loraplex.accounting.ledger import UsageLedger
from loraplex.admission.actor import LimiterActor
from loraplex.admission.budget_source import month_to_date
from loraplex.db.engine import make_engine

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "accounting"))
from usage_builders import make_record  # noqa: E402

NOV = datetime(2026, 11, 1, tzinfo=timezone.utc)


def test_month_to_date_sums_the_tenants_month_and_finds_ledgered_ids(db_url, tmp_path):
    db = make_engine(db_url)
    with UsageLedger(engine=db, spool_dir=str(tmp_path / "spool")) as ledger:
        ledger.append(make_record(1))  # 100 + 20
        ledger.append(make_record(2, completion_tokens=30))
        ledger.append(make_record(3, at=datetime(2026, 10, 31, 12, tzinfo=timezone.utc)))  # last month
        ledger.append(make_record(4, tenant="t2"))
        ledger.flush()
    total, present = month_to_date(db, "t1", NOV, ["req-t1-1", "req-t1-9"])
    assert total == 250 and present == {"req-t1-1"}
    assert month_to_date(db, "nobody", NOV, []) == (0, set())
    db.dispose()


def test_actor_reads_the_ledger_once_per_cache_period(tmp_path):
    url = f"sqlite:///{tmp_path}/db.sqlite"
    db = make_engine(url)
    with UsageLedger(engine=db, spool_dir=str(tmp_path / "spool")) as ledger:
        now = datetime.now(timezone.utc)
        ledger.append(make_record(1, at=now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)))
        ledger.flush()
    actor = LimiterActor(url, budget_cache_s=60)

    async def go():
        limits = {"budget": 200}
        ok = await actor.acquire("t1", "r0", limits, {"budget": 80}, {"budget": 80})
        refused = await actor.acquire("t1", "r0", limits, {"budget": 10}, {"budget": 10})
        return ok, refused

    ok, refused = asyncio.run(go())
    assert ok["granted"] == {"budget": 80}  # 120 in the ledger + 80 = 200
    assert refused["refused"] == "budget_exceeded" and refused["retry_after"] == 1  # 80 in flight
    db.dispose()
