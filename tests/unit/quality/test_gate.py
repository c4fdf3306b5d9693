"""The gate: a move to another base needs a passing run for that tenant and adapter, or an override."""

import pytest

from loraplex.quality.gate import Move, Override, QualityRunRequired, RunRecord, check, needs_run, price_cheaper

FULL, INT4 = "SmolLM2-135M-Instruct", "SmolLM2-135M-Instruct-W4A16"
MOVE = Move("ten_a", "pirate", FULL, INT4)
PASSED = RunRecord("qrun_1", "ten_a", FULL, "pirate", INT4, "pirate", passed=True)


def refused(move, runs=(), overrides=(), **kw):
    with pytest.raises(QualityRunRequired) as exc:
        check(move, runs, overrides, **kw)
    return exc.value


def test_adapter_on_another_base_without_a_run_gets_409_naming_the_run():
    err = refused(MOVE)
    assert err.status == 409 and err.code == "quality_run_required"
    assert f"--reference pirate --candidate {INT4}:pirate" in err.message


def test_passing_run_for_that_tenant_and_adapter_clears_it():
    check(MOVE, [PASSED], [])


@pytest.mark.parametrize("other", [
    RunRecord("qrun_2", "ten_b", FULL, "pirate", INT4, "pirate", passed=True),  # another tenant's
    RunRecord("qrun_3", "ten_a", FULL, "parrot", INT4, "parrot", passed=True),  # another adapter
    RunRecord("qrun_4", "ten_a", FULL, None, INT4, None, passed=True),  # the bases alone, not the adapter
    RunRecord("qrun_5", "ten_a", FULL, "pirate", FULL, "pirate", passed=True),  # another candidate base
])
def test_a_run_for_anything_else_does_not(other):
    refused(MOVE, [other])


def test_failed_run_is_named_with_its_failures():
    failed = RunRecord("qrun_9", "ten_a", FULL, "pirate", INT4, "pirate", passed=False,
                       summary="fail: exact_match_rate 0.000 (quality.thresholds.min_exact_match_rate 0.4)")
    err = refused(MOVE, [failed])
    assert "qrun_9" in err.message and "exact_match_rate 0.000" in err.message


def test_override_of_the_operator_clears_it_for_that_tenant_and_adapter_only():
    check(MOVE, [], [Override("ten_a", "pirate", INT4, "accepted by the customer")])
    refused(MOVE, [], [Override("ten_b", "pirate", INT4, "another tenant")])
    refused(MOVE, [], [Override("ten_a", "parrot", INT4, "another adapter")])


def test_adapter_on_its_own_base_needs_nothing():
    check(Move("ten_a", "pirate", FULL, FULL), [], [])


def test_plan_moves_only_to_a_cheaper_base_need_a_run():
    prices = {FULL: 1.0, INT4: 0.5}
    cheaper = price_cheaper(prices.__getitem__)
    down, up = Move("ten_a", None, FULL, INT4), Move("ten_a", None, INT4, FULL)
    assert needs_run(down, cheaper) and not needs_run(up, cheaper)
    check(up, [], [], cheaper=cheaper)
    err = refused(down, cheaper=cheaper)
    assert f"--reference {FULL} --candidate {INT4}" in err.message
    check(down, [RunRecord("qrun_6", "ten_a", FULL, None, INT4, None, passed=True)], [], cheaper=cheaper)
