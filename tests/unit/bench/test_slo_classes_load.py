"""`python -m bench slo_classes --load`: the mix scaled, each sender kept."""

from bench.scenarios.slo_classes import MIX, scaled


def test_the_load_scales_in_flight_counts_and_the_interactive_rate():
    half = {name: arg for name, _, _, arg, _, _ in scaled(MIX, 0.5)}
    assert half == {"interactive": 0.25, "chat": 2, "agent": 1, "batch": 2}
    assert scaled(MIX, 1.0) == MIX


def test_a_closed_loop_keeps_one_request_in_flight_at_any_load():
    tiny = scaled(MIX, 0.1)
    assert [s[0] for s in tiny] == [s[0] for s in MIX]
    assert all(arg >= 1 for _, _, kind, arg, _, _ in tiny if kind == "closed")
