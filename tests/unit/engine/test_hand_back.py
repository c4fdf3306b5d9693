"""engine/hand_back.py: when a stopping replica hands its running calls back."""

from loraplex.engine.hand_back import HAND_BACK_MARGIN_S, HandBackClock


def test_nothing_goes_back_while_serve_is_not_stopping_the_replica():
    clock = HandBackClock(grace_s=60.0)
    assert not any(clock.due(False, now) for now in (0.0, 100.0, 10_000.0))
    assert clock.stopping_since is None


def test_calls_go_back_the_margin_before_the_graceful_period_ends_counted_from_the_stop():
    clock = HandBackClock(grace_s=60.0)
    assert not clock.due(False, 500.0)
    assert not clock.due(True, 1000.0)  # first seen stopping: the period starts here, not at 0
    assert not clock.due(True, 1000.0 + 60.0 - HAND_BACK_MARGIN_S - 0.1)
    assert clock.due(True, 1000.0 + 60.0 - HAND_BACK_MARGIN_S)


def test_a_short_graceful_period_keeps_its_first_half_for_calls_to_end_where_they_are():
    assert HandBackClock(grace_s=4.0).delay_s == 2.0
    assert HandBackClock(grace_s=0.0).due(True, 7.0)
