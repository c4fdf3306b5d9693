import json
import os

import pytest

from loraplex.accounting.spool import SpoolLocked, UsageSpool


def test_append_rotate_read_discard(tmp_path):
    spool = UsageSpool(tmp_path)
    for i in range(3):
        spool.append(json.dumps({"n": i}))
    assert spool.sealed() == []  # the current segment is never handed to the flusher
    spool.rotate()
    spool.rotate()  # nothing new: no empty segment
    spool.append(json.dumps({"n": 3}))
    [path] = spool.sealed()
    seg = spool.read(path)
    assert [e["n"] for e in seg.entries] == [0, 1, 2]
    assert spool.pending_bytes() == path.stat().st_size + len('{"n": 3}\n')  # sealed + current
    spool.discard(seg)
    assert spool.sealed() == [] and not path.exists()
    assert spool.pending_bytes() == len('{"n": 3}\n')
    spool.close()


def test_torn_tail_is_dropped_and_restart_uses_a_new_segment(tmp_path):
    spool = UsageSpool(tmp_path)
    spool.append('{"n": 1}')
    with open(tmp_path / "segment-000000000001.jsonl", "ab") as f:
        f.write(b'{"n": 2, "torn')  # a crash mid-write
    spool.close()
    again = UsageSpool(tmp_path)
    again.append('{"n": 3}')  # must not be glued onto the torn line
    [old] = again.sealed()
    assert again.read(old).entries == [{"n": 1}]
    again.rotate()
    assert [again.read(p).entries for p in again.sealed()] == [[{"n": 1}], [{"n": 3}]]
    again.close()


def test_corrupt_line_keeps_the_segment_aside(tmp_path):
    (tmp_path / "segment-000000000001.jsonl").write_bytes(b'{"n": 1}\nnot json\n{"n": 2}\n{"n\n')
    spool = UsageSpool(tmp_path)
    seg = spool.read(spool.sealed()[0])
    assert seg.entries == [{"n": 1}, {"n": 2}] and seg.bad_lines == 2
    spool.discard(seg)
    assert (tmp_path / "segment-000000000001.corrupt").exists() and spool.sealed() == []
    spool.close()


def count_fdatasync(monkeypatch) -> list[int]:
    """Counts os.fdatasync calls (the spool's only durability call for data), and still syncs."""
    calls, real = [], os.fdatasync
    monkeypatch.setattr(os, "fdatasync", lambda fd: (calls.append(fd), real(fd))[1])
    return calls


def test_sync_mode_always_syncs_every_append(tmp_path, monkeypatch):
    with pytest.raises(ValueError):
        UsageSpool(tmp_path / "x", sync_mode="never")
    spool = UsageSpool(tmp_path / "a", sync_mode="always")
    calls = count_fdatasync(monkeypatch)
    for i in range(3):
        spool.append(json.dumps({"n": i}))
        assert len(calls) == i + 1  # before append returns
    spool.sync()
    assert len(calls) == 3  # nothing left dirty: sync() has nothing to do
    spool.close()


def test_sync_mode_batch_syncs_only_on_sync(tmp_path, monkeypatch):
    spool = UsageSpool(tmp_path, sync_mode="batch")
    calls = count_fdatasync(monkeypatch)
    for i in range(3):
        spool.append(json.dumps({"n": i}))
    assert calls == []  # the request path never waits on the disk
    spool.sync()
    assert len(calls) == 1  # one group commit for the three
    spool.sync()
    assert len(calls) == 1  # clean: no second fdatasync
    spool.append("{}")
    spool.rotate()  # sealing a segment syncs it
    assert len(calls) == 2
    spool.sync()
    assert len(calls) == 2  # the new segment has nothing to sync
    spool.close()


def test_fresh_line_keeps_a_torn_line_from_corrupting_the_next_record(tmp_path):
    spool = UsageSpool(tmp_path)
    spool.append('{"n": 1}')
    os.write(spool._fd, b'{"n": 2, "to')  # a write cut short, no newline
    spool.append('{"n": 3}', fresh_line=True)
    spool.append('{"n": 4}')
    spool.rotate()
    [path] = spool.sealed()
    seg = UsageSpool.read(path)
    assert seg.entries == [{"n": 1}, {"n": 3}, {"n": 4}] and seg.bad_lines == 1
    spool.close()


def test_without_fresh_line_the_torn_line_eats_the_next_record(tmp_path):
    # What fresh_line is for: the same torn write, then a plain append.
    spool = UsageSpool(tmp_path)
    os.write(spool._fd, b'{"n": 2, "to')
    spool.append('{"n": 3}')
    spool.rotate()
    seg = UsageSpool.read(spool.sealed()[0])
    assert seg.entries == [] and seg.bad_lines == 1
    spool.close()


def test_one_owner_per_directory(tmp_path):
    spool = UsageSpool(tmp_path)
    with pytest.raises(SpoolLocked):
        UsageSpool(tmp_path)
    spool.close()
    UsageSpool(tmp_path).close()  # free again once closed


def test_close_removes_an_empty_current_segment(tmp_path):
    UsageSpool(tmp_path).close()
    assert list(tmp_path.glob("segment-*")) == []


def test_a_closed_spool_refuses_appends_and_closes_once(tmp_path):
    spool = UsageSpool(tmp_path)
    spool.append("{}")
    spool.close()
    with pytest.raises(RuntimeError, match="is closed"):
        spool.append("{}")
    spool.close()  # a second close does nothing (and touches no other fd)
    assert [UsageSpool.read(p).entries for p in tmp_path.glob("segment-*.jsonl")] == [[{}]]
