"""The usage spool's disk full: no served request goes unbilled. Records the spool refuses are
held in memory and written straight into the database by the next flush; with the database down
too, past accounting.max_unspooled_records the ledger says why new requests must be refused."""
import errno

import pytest
from sqlalchemy import func, select
from sqlalchemy.exc import OperationalError

from loraplex.accounting.ledger import UsageLedger
from loraplex.accounting.tables import usage_records, usage_rejections
from small_disk import fill, small_disk
from usage_builders import make_record


def rows(ledger) -> list[str]:
    with ledger.engine.connect() as conn:
        return sorted(r for (r,) in conn.execute(select(usage_records.c.request_id)))


def disk_full(entry, fresh_line=False):
    raise OSError(errno.ENOSPC, "No space left on device")


def database_down(conn, rows):
    raise OperationalError("INSERT", {}, Exception("connection refused"))


def test_records_the_spool_refuses_go_into_the_database_at_the_next_flush(db_url, tmp_path):
    with UsageLedger(db_url, tmp_path / "spool", flush_interval_s=3600) as ledger:
        real_append, ledger.spool.append = ledger.spool.append, disk_full
        for i in range(5):
            ledger.append(make_record(i))
        assert ledger.unspooled_records() == 5 and ledger.spool_failures == 5
        ledger.flush()  # the disk is still full: the database takes them
        assert ledger.unspooled_records() == 0 and rows(ledger) == [f"req-t1-{i}" for i in range(5)]
        assert ledger.refusal() is None
        ledger.spool.append = real_append
        ledger.append(make_record(1))  # the same request again, now through the spool: still one row
        ledger.flush()
        assert rows(ledger) == [f"req-t1-{i}" for i in range(5)]


def test_past_the_bound_new_requests_are_refused_naming_the_spool_until_the_database_takes_them(tmp_path, monkeypatch):
    with UsageLedger(f"sqlite:///{tmp_path}/x.db", tmp_path / "spool", flush_interval_s=3600,
                     max_unspooled=3) as ledger:
        ledger.spool.append = disk_full
        monkeypatch.setattr(UsageLedger, "_insert_usage", staticmethod(database_down))
        for i in range(3):
            assert ledger.refusal() is None
            ledger.append(make_record(i))
        with pytest.raises(OperationalError):
            ledger.flush()
        why = ledger.refusal()
        assert why is not None and str(ledger.spool.dir) in why and "No space left" in why
        assert "accounting.max_unspooled_records" in why and ledger.unspooled_records() == 3
        monkeypatch.undo()  # the database is back, the disk still full
        ledger.flush()
        assert ledger.refusal() is None and rows(ledger) == ["req-t1-0", "req-t1-1", "req-t1-2"]


def test_rejection_counts_a_full_spool_refuses_wait_for_the_next_flush(tmp_path):
    with UsageLedger(f"sqlite:///{tmp_path}/x.db", tmp_path / "spool", flush_interval_s=3600) as ledger:
        real_append, ledger.spool.append = ledger.spool.append, disk_full
        ledger.reject("t1", "429:rate_limit_requests")
        ledger.flush()  # not a failed flush: the counts are kept
        ledger.spool.append = real_append
        ledger.flush()
        with ledger.engine.connect() as conn:
            assert conn.execute(select(func.sum(usage_rejections.c.count))).scalar() == 1


def test_a_segment_that_cannot_be_sealed_is_not_flushed_while_still_written(tmp_path, monkeypatch):
    with UsageLedger(f"sqlite:///{tmp_path}/x.db", tmp_path / "spool", flush_interval_s=3600) as ledger:
        ledger.append(make_record(1))
        real_open = ledger.spool._open
        monkeypatch.setattr(ledger.spool, "_open", lambda n: (_ for _ in ()).throw(OSError(errno.ENOSPC, "full")))
        ledger.flush()  # the open segment stays open, unread and undeleted
        ledger.append(make_record(2))  # into that same segment
        monkeypatch.setattr(ledger.spool, "_open", real_open)
        ledger.flush()
        assert rows(ledger) == ["req-t1-1", "req-t1-2"]


def test_spool_on_a_full_tmpfs_loses_no_record_and_bills_none_twice(tmp_path, monkeypatch):
    """A real full disk: served while it is full (the database takes the records), held in memory
    while the database is down too, refused past the bound; every record in the ledger once after."""
    with small_disk(tmp_path / "disk", "1m") as disk:
        with UsageLedger(f"sqlite:///{tmp_path}/x.db", disk / "spool", flush_interval_s=3600, fsync_interval_s=0.01,
                         max_unspooled=20) as ledger:
            filler = fill(disk)
            for i in range(10):
                ledger.append(make_record(i))
            assert ledger.unspooled_records() == 10 and isinstance(ledger.last_error, OSError)
            ledger.flush()
            assert len(rows(ledger)) == 10 and ledger.unspooled_records() == 0
            monkeypatch.setattr(UsageLedger, "_insert_usage", staticmethod(database_down))
            for i in range(10, 30):
                ledger.append(make_record(i))
            with pytest.raises(OperationalError):
                ledger.flush()
            assert ledger.unspooled_records() == 20 and str(disk / "spool") in ledger.refusal()
            filler.unlink()  # the disk is freed: the held records go into the spool
            assert ledger.retry_unspooled() == 0 and ledger.refusal() is None
            monkeypatch.undo()  # and the database is back
            ledger.flush()
            assert rows(ledger) == sorted(f"req-t1-{i}" for i in range(30))
