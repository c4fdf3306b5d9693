"""The fair queue's admission by SLO class (fair_queue.py, slack_order.py), on a fake clock: each
rule of docs/operations.md's "SLO classes" for the queue, each test failing without it."""

import math

from loraplex.engine.config import FairQueueConfig
from loraplex.engine.dispatch_limit import FixedLimit
from loraplex.engine.fair_queue import Entry, FairQueue

INTERACTIVE, CHAT, AGENT = 1.0, 2.5, 5.0  # TTFT targets, seconds
BULK = math.inf  # a class without a TTFT target (slack_order.class_target)


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def full_queue(classes: bool = True, **cfg) -> tuple[FairQueue, Clock, list]:
    """A queue whose one slot is taken (by `x`): what is submitted next waits. The list gets each
    entry as it is dispatched."""
    clock = Clock()
    q = FairQueue(FairQueueConfig(**{"newcomer_slots": 0, "max_queued": 100, **cfg}), FixedLimit(1), 8,
                  clock=clock, wall=clock, slo_classes=classes)
    order = []
    q.submit(waiting("x", order, ttft=CHAT))
    return q, clock, order


def waiting(tenant: str, order: list, ttft=None, **kw) -> Entry:
    return Entry(tenant, ttft_s=ttft, ready=order.append, **kw)


def served(q: FairQueue, order: list) -> list[str]:
    """Finish what runs, one at a time; the tenants in the order they were dispatched (after `x`)."""
    i = 0
    while i < len(order):
        q.finish(order[i])
        i += 1
    return [e.tenant for e in order[1:]]


def test_the_request_closest_to_missing_its_ttft_goes_first_with_classes_on():
    def order(classes: bool) -> list[str]:
        q, clock, dispatched = full_queue(classes)
        q.submit(waiting("doc", dispatched, ttft=CHAT))
        q.submit(waiting("complete", dispatched, ttft=INTERACTIVE))
        q.charge("complete", 100, 0)  # ahead of doc by counter, within the bound (1,000)
        clock.now += 0.2
        return served(q, dispatched)

    assert order(True) == ["complete", "doc"]  # 0.8 s of slack against 2.3 s
    assert order(False) == ["doc", "complete"]  # classes off: by counter, as before


def test_a_tenant_further_ahead_than_the_bound_waits_its_turn_by_counter():
    def order(bound: float) -> list[str]:
        q, _, dispatched = full_queue(slack_bound_tokens=bound)
        q.submit(waiting("doc", dispatched, ttft=CHAT))
        q.submit(waiting("complete", dispatched, ttft=INTERACTIVE))
        q.charge("complete", 600, 0)
        return served(q, dispatched)

    assert order(500) == ["doc", "complete"]
    assert order(1000) == ["complete", "doc"]


def test_a_request_past_its_ttft_does_not_go_before_one_that_can_still_meet_its_own():
    q, clock, dispatched = full_queue()
    q.submit(waiting("late", dispatched, ttft=INTERACTIVE))
    clock.now += 1.5  # late has waited past its 1 s
    q.submit(waiting("chat", dispatched, ttft=CHAT))
    q.charge("chat", 100, 0)  # chat is ahead by counter: only its slack puts it first
    assert served(q, dispatched) == ["chat", "late"]


def test_the_wait_before_the_queue_counts_against_the_slack():
    q, clock, dispatched = full_queue()
    q.submit(waiting("chat", dispatched, ttft=CHAT, arrival=clock.now - 2.0))  # 2 s in the ingress already
    q.submit(waiting("complete", dispatched, ttft=INTERACTIVE))
    q.charge("complete", -100, 0)  # the lower counter, too: only slack puts chat first
    assert served(q, dispatched) == ["chat", "complete"]  # 0.5 s of slack against 1.0 s


def test_a_class_without_a_ttft_target_goes_after_a_class_with_one():
    q, _, dispatched = full_queue()
    q.submit(waiting("bulk", dispatched, ttft=BULK))  # the lowest counter
    q.submit(waiting("chat", dispatched, ttft=CHAT))
    q.submit(waiting("complete", dispatched, ttft=INTERACTIVE))
    q.charge("chat", 300, 0)
    q.charge("complete", 500, 0)
    assert served(q, dispatched) == ["complete", "chat", "bulk"]


def test_a_class_without_a_ttft_target_is_never_urgent_even_within_the_bound():
    q, clock, dispatched = full_queue()
    q.submit(waiting("late", dispatched, ttft=INTERACTIVE))  # past its target below: not urgent
    q.submit(waiting("bulk", dispatched, ttft=BULK))
    q.submit(waiting("agent", dispatched, ttft=AGENT))
    clock.now += 1.5
    q.charge("bulk", 200, 0)
    q.charge("agent", 400, 0)
    # agent by slack; then late before bulk, by counter: a class with no target is not served by slack.
    assert served(q, dispatched) == ["agent", "late", "bulk"]


def test_work_without_a_class_counts_for_no_class():
    q, _, dispatched = full_queue()
    q.submit(waiting("probe", dispatched, ttft=None))  # no class at all: one TTFT target waits
    q.submit(waiting("chat", dispatched, ttft=CHAT))
    q.charge("chat", 100, 0)
    assert served(q, dispatched) == ["probe", "chat"]


def test_one_ttft_target_waiting_keeps_the_counters_order():
    q, clock, dispatched = full_queue()
    q.submit(waiting("old", dispatched, ttft=CHAT))
    clock.now += 1.0
    q.submit(waiting("new", dispatched, ttft=CHAT))
    q.charge("old", 100, 0)  # by slack the older one would go first; by counter the newer
    assert served(q, dispatched) == ["new", "old"]


def test_slack_never_crosses_a_priority():
    q, _, dispatched = full_queue()
    q.submit(waiting("doc", dispatched, ttft=CHAT, priority=50))
    q.submit(waiting("complete", dispatched, ttft=INTERACTIVE, priority=0))
    assert served(q, dispatched) == ["doc", "complete"]


def test_a_tenants_own_requests_stay_in_arrival_order():
    q, clock, dispatched = full_queue()
    first = waiting("a", dispatched, ttft=CHAT)
    q.submit(first)
    q.submit(waiting("b", dispatched, ttft=AGENT))
    clock.now += 0.1
    q.submit(waiting("a", dispatched, ttft=INTERACTIVE))  # its class changed: still behind its first
    q.finish(dispatched[0])
    assert dispatched[1] is first


def test_the_bound_is_measured_from_the_lowest_counter_of_the_same_priority():
    clock = Clock()
    q = FairQueue(FairQueueConfig(newcomer_slots=1), FixedLimit(1), 8, clock=clock, wall=clock, slo_classes=True)
    dispatched = []
    for e in (waiting("top", dispatched, ttft=CHAT, priority=50), waiting("top", dispatched, ttft=CHAT, priority=50),
              waiting("x", dispatched, ttft=CHAT), waiting("doc", dispatched, ttft=CHAT),
              waiting("complete", dispatched, ttft=INTERACTIVE)):
        q.submit(e)  # top runs one and queues one; x takes the reserved slot; doc and complete queue
    q.charge("doc", 2000, 0)
    q.charge("complete", 2500, 0)  # 500 above its priority's lowest, 2,500 above top's
    q.finish(dispatched[1])  # x's reserved slot frees: top is at its share, so one of priority 0 takes it
    assert dispatched[2].tenant == "complete"
