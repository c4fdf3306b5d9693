import threading
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import Column, Integer, MetaData, Table, inspect, select, text

from loraplex.db.engine import make_engine
from loraplex.db.migrations import applied_versions, migrate
from loraplex.db.types import UTCDateTime
from loraplex.db.migrations import Migration


def test_sqlite_engine_uses_wal_and_busy_timeout(tmp_path):
    engine = make_engine(f"sqlite:///{tmp_path}/sub/dir/x.db")  # creates parent dirs
    with engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 5000


def test_postgres_url_gets_psycopg3_driver():
    engine = make_engine("postgresql://u:p@127.0.0.1:1/db")
    assert engine.dialect.driver == "psycopg"


def test_rejects_other_backends():
    with pytest.raises(ValueError):
        make_engine("mysql://u@h/db")


def _counter_migrations(calls):
    meta = MetaData()
    t = Table("widgets", meta, Column("id", Integer, primary_key=True))

    def v1(conn):
        calls.append(1)
        meta.create_all(conn)

    def v2(conn):
        calls.append(2)
        conn.execute(text("ALTER TABLE widgets ADD COLUMN size INTEGER"))
    return t, [Migration("widgets", 2, "size", v2), Migration("widgets", 1, "create", v1)]


def test_migrations_apply_in_order_once(db_url):
    engine = make_engine(db_url)
    calls = []
    _, migrations = _counter_migrations(calls)
    assert [m.version for m in migrate(engine, migrations)] == [1, 2]
    assert migrate(engine, migrations) == []
    assert calls == [1, 2]
    assert applied_versions(engine) == {"widgets": {1, 2}}
    assert {c["name"] for c in inspect(engine).get_columns("widgets")} == {"id", "size"}


def test_failed_migration_rolls_back(db_url):
    engine = make_engine(db_url)

    def broken(conn):
        conn.execute(text("CREATE TABLE half_done (id INTEGER)"))
        raise RuntimeError("boom")
    with pytest.raises(RuntimeError):
        migrate(engine, [Migration("x", 1, "broken", broken)])
    assert "x" not in applied_versions(engine)
    assert not inspect(engine).has_table("half_done")  # DDL is transactional on both backends


def test_concurrent_migrate_applies_once(db_url):
    engine = make_engine(db_url)
    calls = []
    _, migrations = _counter_migrations(calls)
    errors = []

    def run():
        try:
            migrate(engine, migrations)
        except Exception as e:  # noqa: BLE001
            errors.append(e)
    threads = [threading.Thread(target=run) for _ in range(4)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert errors == [] and calls == [1, 2]


def test_utc_datetime_round_trip(db_url):
    engine = make_engine(db_url)
    meta = MetaData()
    t = Table("times", meta, Column("id", Integer, primary_key=True), Column("at", UTCDateTime))
    meta.create_all(engine)
    plus2 = timezone(timedelta(hours=2))
    when = datetime(2026, 1, 2, 5, 6, 7, 123456, tzinfo=plus2)
    with engine.begin() as conn:
        conn.execute(t.insert().values(id=1, at=when))
        got = conn.execute(select(t.c.at)).scalar()
    assert got == when and got.tzinfo == timezone.utc and got.hour == 3
    with pytest.raises(Exception):
        with engine.begin() as conn:
            conn.execute(t.insert().values(id=2, at=datetime(2026, 1, 1)))
