import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import func, select

from loraplex.accounting.ledger import UsageLedger
from loraplex.accounting.rejections import rejection_counts
from loraplex.accounting.spool import SpoolLocked
from loraplex.accounting.tables import usage_records, usage_rejections
from usage_builders import make_record


def count_rows(ledger, table=usage_records):
    with ledger.engine.connect() as conn:
        return conn.execute(select(func.count()).select_from(table)).scalar()


def request_ids(ledger):
    with ledger.engine.connect() as conn:
        return [r for (r,) in conn.execute(select(usage_records.c.request_id))]


def test_same_request_id_twice_is_one_row(db_url, tmp_path):
    with UsageLedger(db_url, tmp_path / "spool") as ledger:
        ledger.append(make_record(1))
        ledger.append(make_record(1))
        r = ledger.flush()
        assert (r.records, r.inserted, r.duplicates) == (2, 1, 1)
        ledger.append(make_record(1))  # a retried write in a later batch
        assert ledger.flush().inserted == 0
        assert count_rows(ledger) == 1
    with UsageLedger(db_url, tmp_path / "spool2") as again:  # another replica / a restart
        again.append(make_record(1))
        assert again.flush().inserted == 0
        assert count_rows(again) == 1


def test_the_record_of_the_replica_a_request_moved_to_supersedes_a_lost_replicas(db_url, tmp_path):
    """A replica that lost its caller but lived on records what it had; the replica the request
    moved to records it whole (migrated_prompt_tokens > 0): that one is the request's, in whatever
    order they land, in one batch or two; a replay of either changes nothing."""
    partial = make_record(1, completion_tokens=7, status="client_disconnect", replica_id="lost")
    whole = make_record(1, completion_tokens=50, status="stop", replica_id="took-over", migrated_prompt_tokens=130)
    with UsageLedger(db_url, tmp_path / "spool") as ledger:
        ledger.append(partial)
        ledger.append(whole)
        ledger.append(make_record(2, completion_tokens=50, migrated_prompt_tokens=130))
        ledger.flush()
        ledger.append(make_record(2, completion_tokens=7))  # the lost replica's, later
        ledger.append(partial)  # replayed
        ledger.flush()
        with ledger.engine.connect() as conn:
            rows = {r.request_id: (r.completion_tokens, r.migrated_prompt_tokens) for r in conn.execute(
                select(usage_records))}
    assert rows == {"req-t1-1": (50, 130), "req-t1-2": (50, 130)}


def test_record_round_trips_through_the_database(db_url, tmp_path):
    rec = make_record(7, adapter="sql-bot@3f2a", status="client_disconnect")
    with UsageLedger(db_url, tmp_path / "spool") as ledger:
        ledger.append(rec)
        ledger.flush()
        with ledger.engine.connect() as conn:
            row = conn.execute(select(usage_records)).one()._asdict()
    assert row == rec.row()


CHILD = textwrap.dedent("""
    import os, signal, sys, time
    from datetime import datetime, timezone
    from loraplex.accounting.ledger import UsageLedger
    from loraplex.accounting.record import UsageRecord
    url, spool, mode, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    t = datetime(2026, 11, 3, 10, tzinfo=timezone.utc)
    rec = lambda i: UsageRecord(request_id=f"req-{i}", tenant_id="t1", base_model="m", prompt_tokens=10,
                                completion_tokens=5, status="finished", arrival_time=t, finish_time=t)
    ledger = UsageLedger(url, spool, flush_interval_s=3600, flush_batch=10**9).start()
    half = n // 2 if mode == "mid_flush" else n
    for i in range(half):
        ledger.append(rec(i))
    if mode == "after_commit":
        # Die after the DB commit but before the segment is deleted: the worst moment.
        ledger.spool.discard = lambda seg: os.kill(os.getpid(), signal.SIGKILL)
        ledger.flush()
    if mode == "mid_flush":
        ledger.flush()
        for i in range(half, n):
            ledger.append(rec(i))
    os.write(ledger.spool._fd, b'{"request_id": "torn-wri')  # a write cut short by the kill
    print("appended", flush=True)
    time.sleep(120)
""")


@pytest.mark.parametrize("mode", ["before_flush", "mid_flush", "after_commit"])
def test_sigkill_then_replay_keeps_every_record_exactly_once(db_url, tmp_path, mode):
    n, spool = 300, tmp_path / "spool"
    if db_url.startswith("sqlite"):
        UsageLedger(db_url, tmp_path / "init").start().close()  # schema first, as at deploy time
    child = subprocess.Popen([sys.executable, "-c", CHILD, db_url, str(spool), mode, str(n)],
                             stdout=subprocess.PIPE, text=True)
    if mode != "after_commit":
        assert child.stdout.readline().strip() == "appended"
        child.send_signal(signal.SIGKILL)
    assert child.wait(timeout=60) == -signal.SIGKILL

    backup = tmp_path / "backup"
    shutil.copytree(spool, backup, ignore=shutil.ignore_patterns("LOCK"))
    with UsageLedger(db_url, spool) as ledger:  # start() replays the dead process's spool
        assert sorted(request_ids(ledger)) == sorted(f"req-{i}" for i in range(n))
        assert not ledger.spool.sealed()
    # Replaying the same segments again (e.g. the delete was lost) changes nothing.
    for seg in backup.glob("segment-*.jsonl"):
        shutil.copy(seg, spool / seg.name)
    with UsageLedger(db_url, spool) as ledger:
        assert ledger.last_error is None
        assert count_rows(ledger) == n


def test_concurrent_appends_from_threads_give_exactly_n_rows(db_url, tmp_path):
    threads_n, per_thread = 8, 250
    ledger = UsageLedger(db_url, tmp_path / "spool", flush_interval_s=0.02, flush_batch=100).start()

    def worker(k):
        for i in range(per_thread):
            ledger.append(make_record(i, tenant=f"t{k}"))
    threads = [threading.Thread(target=worker, args=(k,)) for k in range(threads_n)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    ledger.close()  # final flush
    assert ledger.last_error is None
    ids = request_ids(ledger)
    assert len(ids) == len(set(ids)) == threads_n * per_thread


def test_database_down_keeps_records_in_spool(tmp_path, caplog):
    spool = tmp_path / "spool"
    down = UsageLedger("postgresql://x:y@127.0.0.1:1/none", spool, run_migrations=False)
    for i in range(5):
        down.append(make_record(i))
    with pytest.raises(Exception):
        down.flush()
    down.close()  # final flush fails too; logged, nothing lost
    assert len(list(spool.glob("segment-*.jsonl"))) >= 1
    with UsageLedger(f"sqlite:///{tmp_path}/up.db", spool) as up:
        assert count_rows(up) == 5


def test_spool_dir_has_one_owner(tmp_path):
    with UsageLedger(f"sqlite:///{tmp_path}/x.db", tmp_path / "spool"):
        with pytest.raises(SpoolLocked):
            UsageLedger(f"sqlite:///{tmp_path}/x.db", tmp_path / "spool")


def test_rejections_are_counted_not_billed(db_url, tmp_path):
    with UsageLedger(db_url, tmp_path / "spool") as ledger:
        ledger.reject("t1", "rate_limited")
        ledger.reject("t1", "rate_limited")
        ledger.reject(None, "unauthorized")
        ledger.append(make_record(1))
        r = ledger.flush()
        assert r.inserted == 1 and r.rejection_rows == 2
        assert ledger.flush().rejection_rows == 0  # drained
        assert count_rows(ledger) == 1
        now = datetime.now(timezone.utc)
        counts = {(c.tenant_id, c.reason): c.count
                  for c in rejection_counts(ledger.engine, now - timedelta(hours=2), now + timedelta(hours=1))}
        assert counts == {("t1", "rate_limited"): 2, ("-", "unauthorized"): 1}
        assert count_rows(ledger, usage_rejections) == 2


def test_background_flusher_moves_records_without_explicit_flush(tmp_path):
    with UsageLedger(f"sqlite:///{tmp_path}/x.db", tmp_path / "spool", flush_interval_s=0.05) as ledger:
        ledger.append(make_record(1))
        deadline = time.time() + 10
        while count_rows(ledger) == 0 and time.time() < deadline:
            time.sleep(0.02)
        assert count_rows(ledger) == 1


def test_dead_replicas_spool_is_adopted_by_a_sibling(db_url, tmp_path):
    root = tmp_path / "spool"
    if db_url.startswith("sqlite"):
        UsageLedger(db_url, root / "init").start().close()
    child = subprocess.Popen([sys.executable, "-c", CHILD, db_url, str(root / "dead"), "before_flush", "50"],
                             stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "appended"
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=60)
    with UsageLedger(db_url, root / "alive", flush_interval_s=3600) as alive:
        alive.append(make_record(1))  # not flushed: a live sibling's spool must not be touched
        with UsageLedger(db_url, root / "new", adopt_orphans=True) as new:
            assert count_rows(new) == 50
            assert list((root / "dead").glob("segment-*.jsonl")) == []
        assert len(list((root / "alive").glob("segment-*.jsonl"))) == 1


def test_from_config_gives_each_replica_its_own_spool_with_the_configured_timings(tmp_path):
    from loraplex.accounting.config import AccountingConfig
    from loraplex.db.engine import make_engine
    cfg = AccountingConfig(spool_dir=str(tmp_path), sync_mode="always", fsync_interval_s=0.2,
                           flush_interval_s=3.0, flush_batch=7)
    ledger = UsageLedger.from_config(cfg, "Engine#a1:B-2.x_y", make_engine(f"sqlite:///{tmp_path}/x.db"))
    try:
        assert ledger.spool.dir == tmp_path / "Engine_a1_B-2.x_y"  # '#' and ':' are not path-safe
        assert ledger.spool.sync_mode == "always"
        assert (ledger.fsync_interval_s, ledger.flush_interval_s, ledger.flush_batch) == (0.2, 3.0, 7)
        assert ledger.adopt_orphans is True  # a replica replays its dead siblings' spools
    finally:
        ledger.spool.close()


def test_a_full_batch_wakes_the_flusher_before_its_interval(tmp_path):
    with UsageLedger(f"sqlite:///{tmp_path}/x.db", tmp_path / "spool", flush_interval_s=3600,
                     flush_batch=3) as ledger:
        for i in range(3):
            ledger.append(make_record(i))
        deadline = time.time() + 10  # the interval alone would take an hour
        while count_rows(ledger) < 3 and time.time() < deadline:
            time.sleep(0.02)
        assert count_rows(ledger) == 3


def test_a_record_the_disk_tore_is_retried_on_a_fresh_line_and_billed_once(tmp_path):
    with UsageLedger(f"sqlite:///{tmp_path}/x.db", tmp_path / "spool", flush_interval_s=3600) as ledger:
        real_append = ledger.spool.append

        def torn_then_full(entry, fresh_line=False):  # half the line reaches the file, then ENOSPC
            os.write(ledger.spool._fd, entry[:10].encode())
            raise OSError(28, "No space left on device")
        ledger.spool.append = torn_then_full
        ledger.append(make_record(1))
        assert isinstance(ledger.last_error, OSError) and ledger.retry_unspooled() == 1  # still full
        ledger.spool.append = real_append  # room again
        assert ledger.retry_unspooled() == 0
        r = ledger.flush()  # the torn piece is a bad line of its own, the retried record is whole
        assert (r.records, r.inserted) == (1, 1) and request_ids(ledger) == ["req-t1-1"]


def test_rejections_from_two_flushes_in_one_hour_add_up(db_url, tmp_path):
    # Each flush's counts are a batch with its own id: a second batch for the same tenant,
    # reason and hour adds to the first, it is not mistaken for a replay of it.
    with UsageLedger(db_url, tmp_path / "spool") as ledger:
        ledger.reject("t1", "rate_limited")
        assert ledger.flush().rejection_rows == 1
        ledger.reject("t1", "rate_limited")
        ledger.reject("t1", "rate_limited")
        assert ledger.flush().rejection_rows == 1
        now = datetime.now(timezone.utc)
        counts = {(c.tenant_id, c.reason): c.count
                  for c in rejection_counts(ledger.engine, now - timedelta(hours=2), now + timedelta(hours=1))}
        assert counts == {("t1", "rate_limited"): 3}


def test_batch_one_short_of_full_waits_for_the_interval(tmp_path):
    with UsageLedger(f"sqlite:///{tmp_path}/x.db", tmp_path / "spool", flush_interval_s=3600,
                     flush_batch=3) as ledger:
        for batch in range(2):  # the count starts again from 0 after each flush
            ledger.append(make_record(3 * batch))
            ledger.append(make_record(3 * batch + 1))
            time.sleep(0.5)  # a flusher woken early would have moved them by now
            assert count_rows(ledger) == 3 * batch
            ledger.append(make_record(3 * batch + 2))
            deadline = time.time() + 10
            while count_rows(ledger) < 3 * (batch + 1) and time.time() < deadline:
                time.sleep(0.02)
            assert count_rows(ledger) == 3 * (batch + 1)


def test_a_ledger_that_does_not_adopt_leaves_other_spools_alone(tmp_path):
    db_url = f"sqlite:///{tmp_path}/x.db"
    root = tmp_path / "spool"
    gone = UsageLedger(db_url, root / "gone", flush_interval_s=3600)
    gone.append(make_record(1))
    gone.spool.close()  # its replica is gone: a segment with no owner left behind
    with UsageLedger(db_url, root / "ingress", flush_interval_s=3600, adopt_interval_s=0) as ledger:
        ledger.flush()
        ledger.flush()
        assert count_rows(ledger) == 0
    assert list((root / "gone").glob("segment-*.jsonl"))
