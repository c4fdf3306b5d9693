"""A batch's state machine: only OpenAI's moves, each a conditional UPDATE that one caller wins;
counts move with the line results, once per line."""

from datetime import datetime, timedelta, timezone

import pytest

from loraplex.batches import state
from loraplex.batches.jsonl import BatchLine
from loraplex.batches.repository import BatchRepository
from loraplex.batches.tables import MIGRATIONS
from loraplex.db.engine import make_engine
from loraplex.db.migrations import migrate


def test_the_moves_are_openais():
    state.check_move("validating", "in_progress")
    state.check_move("in_progress", "finalizing")
    state.check_move("finalizing", "completed")
    state.check_move("in_progress", "cancelling")
    state.check_move("cancelling", "cancelled")
    state.check_move("in_progress", "expired")
    state.check_move("validating", "failed")
    for current, new in [("completed", "in_progress"), ("cancelled", "cancelling"), ("failed", "in_progress"),
                         ("finalizing", "cancelling"), ("in_progress", "completed"), ("expired", "completed")]:
        with pytest.raises(state.InvalidMove):
            state.check_move(current, new)
    assert state.TERMINAL == {s for s, moves in state.MOVES.items() if not moves}
    assert state.sources_of("cancelling") == ["in_progress", "validating"]


@pytest.fixture
def repo(tmp_path):
    db = make_engine(f"sqlite:///{tmp_path}/db.sqlite")
    migrate(db, MIGRATIONS)
    return BatchRepository(db)


def test_a_move_happens_once_and_only_from_an_allowed_state(repo):
    b = repo.create_batch("t1", "k1", "/v1/chat/completions", "file-x", None, 3600)
    assert repo.move(b["id"], "cancelling")
    assert not repo.move(b["id"], "cancelling")  # already there: the second caller loses
    assert not repo.move(b["id"], "in_progress")  # a cancelled batch never runs on
    assert repo.move(b["id"], "cancelled")
    row = repo.get_batch("t1", b["id"])
    assert row["status"] == "cancelled" and row["cancelling_at"] and row["cancelled_at"]
    assert state.batch_object(row)["cancelled_at"] == int(row["cancelled_at"].timestamp())


def test_a_line_is_counted_once(repo):
    b = repo.create_batch("t1", "k1", "/v1/chat/completions", "file-x", None, 3600)
    lines = [BatchLine(i, f"c{i}", "/v1/chat/completions", {}) for i in range(3)]
    repo.add_lines(b["id"], lines)
    repo.add_lines(b["id"], lines)  # again after a restart: nothing doubles
    assert repo.pending_lines(b["id"]) == [0, 1, 2]
    assert repo.finish_line(b["id"], 0, True, 200, "{}")
    assert not repo.finish_line(b["id"], 0, True, 200, "{}")
    assert repo.finish_line(b["id"], 1, False, 404, "{}")
    row = repo.get_batch("t1", b["id"])
    assert (row["total"], row["completed"], row["failed"]) == (3, 1, 1)
    assert repo.pending_lines(b["id"]) == [2]
    assert state.batch_object(row)["request_counts"] == {"total": 3, "completed": 1, "failed": 1}


def test_a_lease_is_one_runners_until_it_runs_out(repo):
    now = [datetime(2026, 1, 1, tzinfo=timezone.utc)]
    repo.clock = lambda: now[0]
    b = repo.create_batch("t1", None, "/v1/chat/completions", "file-x", None, 3600)
    assert repo.claim("r1", 30)["id"] == b["id"]
    assert repo.claim("r2", 30) is None  # held
    now[0] += timedelta(seconds=31)
    assert repo.claim("r2", 30)["id"] == b["id"]  # r1 is gone: r2 takes over
    assert not repo.renew(b["id"], "r1", 30)
    assert not repo.move(b["id"], "in_progress", owner="r1")  # nor may r1 move it any more
    assert repo.move(b["id"], "in_progress", owner="r2")
    assert repo.in_flight("t1") == 1 and repo.in_flight("t2") == 0


def test_a_parked_batch_says_until_when(repo):
    """batch_tokens_per_day parks a batch in_progress; the object is the only place a client sees why."""
    b = repo.create_batch("t1", "k1", "/v1/chat/completions", "file-x", None, 3600)
    assert state.batch_object(b)["not_before"] is None
    assert repo.claim("runner", 30)["id"] == b["id"]
    until = datetime(2030, 1, 2, tzinfo=timezone.utc)
    assert repo.park(b["id"], "runner", until)
    obj = state.batch_object(repo.get_batch("t1", b["id"]))
    assert obj["not_before"] == int(until.timestamp())


def test_the_openai_sdk_keeps_the_extension_field(repo):
    openai_types = pytest.importorskip("openai.types")
    b = repo.create_batch("t1", "k1", "/v1/chat/completions", "file-x", None, 3600)
    repo.claim("runner", 30)
    repo.park(b["id"], "runner", datetime(2030, 1, 2, tzinfo=timezone.utc))
    parsed = openai_types.Batch.model_validate(state.batch_object(repo.get_batch("t1", b["id"])))
    assert parsed.status == "validating" and parsed.not_before == int(datetime(2030, 1, 2, tzinfo=timezone.utc).timestamp())
