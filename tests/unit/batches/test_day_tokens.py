"""BatchDayTokens: what the day used is the ledger's batch records of the tenant since 00:00 UTC,
plus the lines this runner holds (in flight: their estimate; ended, not yet in the ledger: what
they used). Past the limit: park until the next day; past it only with the lines in flight: wait."""

import asyncio
from datetime import datetime, timezone

import pytest

from loraplex.accounting.tables import MIGRATIONS as ACCOUNTING
from loraplex.accounting.tables import usage_records
from loraplex.batches.day_tokens import BatchDayTokens
from loraplex.db.engine import make_engine
from loraplex.db.migrations import migrate

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)
TOMORROW = datetime(2026, 3, 2, tzinfo=timezone.utc)


@pytest.fixture
def db(tmp_path):
    engine = make_engine(f"sqlite:///{tmp_path}/t.db")
    migrate(engine, ACCOUNTING)
    yield engine
    engine.dispose()


def bill(db, request_id, tokens, tenant="acme", at=NOW, batch=True):
    with db.begin() as conn:
        conn.execute(usage_records.insert().values(
            request_id=request_id, tenant_id=tenant, base_model="base", prompt_tokens=tokens, cached_prompt_tokens=0,
            completion_tokens=0, status="ok", arrival_time=at, finish_time=at, batch=batch))


def take(gate, request_id, charge, limit=100, tenant="acme"):
    return asyncio.run(gate.take(tenant, limit, request_id, charge))


def test_only_todays_batch_records_of_the_tenant_count(db):
    bill(db, "yesterday", 90, at=datetime(2026, 2, 28, 23, 59, tzinfo=timezone.utc))
    bill(db, "online", 90, batch=False)
    bill(db, "other", 90, tenant="globex")
    bill(db, "today", 60)
    gate = BatchDayTokens(db, lambda: NOW)
    assert take(gate, "a", 40) is None  # 60 + 40 fits 100
    gate.settle("acme", "a", 40)
    parked = take(gate, "b", 1)
    assert parked.retry and parked.park_until == TOMORROW
    assert "batch_tokens_per_day is 100" in parked.body["error"]["message"]


def test_lines_in_flight_make_a_line_wait_not_park(db):
    gate = BatchDayTokens(db, lambda: NOW)
    assert take(gate, "a", 60) is None
    waiting = take(gate, "b", 60)
    assert waiting.retry and waiting.park_until is None
    gate.settle("acme", "a", 30)  # it used less than its estimate
    assert take(gate, "b", 60) is None


def test_a_line_ended_but_not_yet_in_the_ledger_counts_once(db):
    gate = BatchDayTokens(db, lambda: NOW)
    assert take(gate, "a", 60) is None
    gate.settle("acme", "a", 60)
    assert take(gate, "b", 60).park_until == TOMORROW  # not in the ledger yet: still counted
    bill(db, "a", 60)
    assert take(gate, "c", 40) is None  # in the ledger now: counted there, not twice


def test_a_refused_line_gives_its_charge_back(db):
    gate = BatchDayTokens(db, lambda: NOW)
    assert take(gate, "a", 60) is None
    gate.settle("acme", "a", None)
    assert take(gate, "b", 100) is None


def test_a_line_bigger_than_the_whole_day_fails_instead_of_waiting_forever(db):
    refused = take(BatchDayTokens(db, lambda: NOW), "a", 101)
    assert refused.status_code == 429 and not refused.retry and "max_tokens" in refused.body["error"]["message"]


def test_no_limit_takes_nothing(db):
    bill(db, "today", 10_000)
    assert asyncio.run(BatchDayTokens(db, lambda: NOW).take("acme", None, "a", 10)) is None
