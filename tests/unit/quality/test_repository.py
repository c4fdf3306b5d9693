"""QualityRepository on SQLite and PostgreSQL: a run's moves are conditional (two replicas never
both take a step), and the gate reads completed runs and overrides of the tenant."""

import pytest

from loraplex.db.engine import make_engine
from loraplex.quality.gate import Move, QualityRunRequired
from loraplex.quality.repository import QualityRepository, run_object

FULL, INT4 = "full", "int4"


def test_moves_are_conditional_and_the_gate_reads_what_is_on_record(db_url):
    repo = QualityRepository(make_engine(db_url))
    run = repo.create("ten_a", "key", "/v1/chat/completions", "file-x", ("pirate", FULL, "pirate"),
                      (f"{INT4}:pirate", INT4, "pirate"), {"why": "test"})
    assert run["status"] == "queued" and run_object(run)["object"] == "quality.run"
    assert [r["id"] for r in repo.active()] == [run["id"]]
    assert repo.move(run["id"], "generating", generation_batch_id="batch_1")
    assert not repo.move(run["id"], "generating", generation_batch_id="batch_2")  # another replica lost the step
    assert repo.get("ten_a", run["id"])["generation_batch_id"] == "batch_1"
    assert repo.get("ten_b", run["id"]) is None  # another tenant's run is a missing one

    move = Move("ten_a", "pirate", FULL, INT4)
    with pytest.raises(QualityRunRequired):  # running, not yet passed
        repo.check_move(move)
    assert repo.move(run["id"], "completed", report={"figures": {}}, passed=True, summary="pass")
    assert repo.active() == []
    repo.check_move(move)
    with pytest.raises(QualityRunRequired):
        repo.check_move(Move("ten_b", "pirate", FULL, INT4))
    repo.add_override("ten_b", "pirate", INT4, "accepted")
    repo.check_move(Move("ten_b", "pirate", FULL, INT4))
    assert [o["reason"] for o in repo.overrides("ten_b")] == ["accepted"]


def test_a_failed_run_does_not_clear_the_gate(db_url):
    repo = QualityRepository(make_engine(db_url))
    run = repo.create("ten_a", None, "/v1/chat/completions", "file-x", ("pirate", FULL, "pirate"),
                      (f"{INT4}:pirate", INT4, "pirate"))
    assert not repo.move(run["id"], "completed", passed=True)  # a queued run has no figures to complete with
    assert repo.move(run["id"], "generating") and repo.move(run["id"], "completed", passed=False,
                                                            summary="fail: exact_match_rate 0.000")
    with pytest.raises(QualityRunRequired, match="exact_match_rate 0.000"):
        repo.check_move(Move("ten_a", "pirate", FULL, INT4))
