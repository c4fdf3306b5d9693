"""slack_order.py, the rule the fair queue's admission and the step's prefill order share (their
own tests: test_fair_queue_classes.py, test_slo_classes.py)."""
import math

from loraplex.engine.slack_order import Claim, class_target, slack_rank, urgent_tenants


def claim(tenant, slack, counter=0.0, target=None, tier=0, batch=False) -> Claim:
    target = target if target is not None else (slack if slack < math.inf else math.inf)
    return Claim(tenant, tier, counter, slack, frozenset({target}), batch)


def test_a_class_without_a_target_waits_with_an_infinite_one_and_no_class_with_none():
    assert class_target("batch", None) == math.inf
    assert class_target("chat", 2.5) == 2.5
    assert class_target("", None) is None and class_target(None, 1.0) is None


def test_the_urgent_are_within_the_bound_of_their_tiers_lowest_with_a_finite_slack_not_past():
    claims = [claim("tight", 0.5), claim("loose", 2.0, counter=0.9), claim("ahead", 0.1, counter=1.5),
              claim("late", -0.2, target=1.0), claim("bulk", math.inf), claim("line", 0.3, batch=True),
              claim("other-tier", 0.1, counter=5.0, tier=1)]
    assert urgent_tenants(claims, 1.0) == {"tight", "loose", "other-tier"}
    assert urgent_tenants(claims, None) == set()
    ordered = sorted(claims, key=lambda c: (c.tier, *slack_rank(c, {"tight", "loose"}), c.counter))
    assert [c.tenant for c in ordered][:3] == ["tight", "loose", "late"]


def test_one_target_waiting_makes_none_urgent():
    assert urgent_tenants([claim("a", 0.5, target=2.5), claim("b", 1.5, target=2.5)], 1.0) == set()
