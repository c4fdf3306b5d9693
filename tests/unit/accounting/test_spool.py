import json

import pytest

from loraplex.accounting import SpoolLocked, UsageSpool


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
    spool.discard(seg)
    assert spool.sealed() == [] and not path.exists()
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
    (tmp_path / "segment-000000000001.jsonl").write_bytes(b'{"n": 1}\nnot json\n{"n": 2}\n')
    spool = UsageSpool(tmp_path)
    seg = spool.read(spool.sealed()[0])
    assert seg.entries == [{"n": 1}, {"n": 2}] and seg.bad_lines == 1
    spool.discard(seg)
    assert (tmp_path / "segment-000000000001.corrupt").exists() and spool.sealed() == []
    spool.close()


def test_sync_modes(tmp_path):
    with pytest.raises(ValueError):
        UsageSpool(tmp_path / "x", sync_mode="never")
    spool = UsageSpool(tmp_path / "a", sync_mode="always")
    spool.append("{}")
    spool.sync()
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
