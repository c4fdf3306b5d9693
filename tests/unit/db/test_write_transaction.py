"""write_transaction on SQLite starts with BEGIN IMMEDIATE: two read-then-write transactions that
overlap neither fail with "database is locked" (SQLITE_BUSY_SNAPSHOT) nor lose an update. The
control case shows the same schedule does fail with a plain (deferred) transaction, so the test
would catch the fix being undone."""

import threading

import pytest
from sqlalchemy import Column, Integer, MetaData, Table, select, update
from sqlalchemy.exc import OperationalError

from loraplex.db.engine import make_engine, write_transaction

meta = MetaData()
counter = Table("counter", meta, Column("id", Integer, primary_key=True), Column("value", Integer))


def increment(engine, transaction, i_have_read: threading.Event, other_has_read: threading.Event) -> None:
    """Read the counter, give the other writer a chance to read too, then write value + 1."""
    with transaction(engine) as conn:
        value = conn.execute(select(counter.c.value).where(counter.c.id == 1)).scalar_one()
        i_have_read.set()
        other_has_read.wait(timeout=1)  # with BEGIN IMMEDIATE the other cannot read before we commit
        conn.execute(update(counter).where(counter.c.id == 1).values(value=value + 1))


def deferred(engine):
    return engine.begin()


@pytest.mark.parametrize("transaction, fails", [(write_transaction, False), (deferred, True)],
                         ids=["write_transaction", "deferred-control"])
def test_overlapping_read_then_write_transactions(tmp_path, transaction, fails):
    engine = make_engine(f"sqlite:///{tmp_path}/x.db")
    meta.create_all(engine)
    with engine.begin() as conn:
        conn.execute(counter.insert().values(id=1, value=0))
    a_read, b_read = threading.Event(), threading.Event()
    errors: list[Exception] = []

    def run(mine, other):
        try:
            increment(engine, transaction, mine, other)
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)
            mine.set()

    first = threading.Thread(target=run, args=(a_read, b_read))
    first.start()
    assert a_read.wait(timeout=10)
    second = threading.Thread(target=run, args=(b_read, a_read))
    second.start()
    first.join(timeout=30)
    second.join(timeout=30)
    with engine.connect() as conn:
        value = conn.execute(select(counter.c.value)).scalar_one()
    if fails:
        assert len(errors) == 1 and isinstance(errors[0], OperationalError), errors
        assert "database is locked" in str(errors[0])
    else:
        assert errors == []
        assert value == 2  # both increments, neither lost
