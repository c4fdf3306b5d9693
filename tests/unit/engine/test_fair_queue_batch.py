"""Batch lines in the fair queue: below every online request, never past batch_max_share of the
limit, the first held back when online work returns; never refused for share; charge nobody."""

from loraplex.engine.config import FairQueueConfig
from loraplex.engine.dispatch_limit import FixedLimit
from loraplex.engine.fair_queue import Entry, FairQueue


def make(limit=4, share=0.5):
    clock = lambda: 1000.0  # noqa: E731
    return FairQueue(FairQueueConfig(newcomer_slots=0, batch_max_share=share), FixedLimit(limit), 8,
                     clock=clock, wall=clock)


def batch(n=1):
    return [Entry("acme", batch=True) for _ in range(n)]


def test_batch_lines_fill_only_their_share_of_an_idle_replica():
    q = make(limit=4, share=0.5)
    lines = batch(4)
    for e in lines:
        q.submit(e)
    assert [e.state for e in lines] == ["running", "running", "queued", "queued"]
    assert q.running == 2 and q.batch_running == 2
    online = Entry("web")
    q.submit(online)  # the slots the batch left free: an online arrival starts at once
    assert online.state == "running"


def test_a_freed_slot_goes_to_queued_online_work_before_any_batch_line():
    q = make(limit=2, share=1.0)
    lines = batch(3)
    for e in lines:
        q.submit(e)
    assert q.batch_running == 2  # share 1.0: an idle replica is the batch's
    waiting = [Entry("web"), Entry("web")]
    for e in waiting:
        q.submit(e)
    assert [e.state for e in waiting] == ["queued", "queued"]
    q.finish(lines[0])
    assert waiting[0].state == "running" and lines[2].state == "queued"
    q.finish(lines[1])
    assert waiting[1].state == "running" and lines[2].state == "queued"
    q.finish(waiting[0])  # no online request queued any more: the batch goes on
    assert lines[2].state == "running"


def test_batch_lines_are_never_refused_for_share_and_charge_no_tenant():
    q = make(limit=1)
    lines = batch(40)  # more than max_queued (24)
    for e in lines:
        q.submit(e)
    assert sum(e.state == "refused" for e in lines) == 0
    assert "acme" not in q.tenants  # no tenant's queue or counter
    q.finish(lines[0])
    assert lines[1].state == "running"
    assert q.snapshot()["batch_queued"] == 38


def test_a_queued_batch_line_past_its_deadline_is_refused():
    now = [1000.0]
    q = FairQueue(FairQueueConfig(newcomer_slots=0), FixedLimit(1), 8, clock=lambda: now[0], wall=lambda: now[0])
    q.submit(Entry("web"))
    line = Entry("acme", batch=True, deadline=1010.0)
    q.submit(line)
    assert line.state == "queued"
    now[0] = 1010.0
    q.expire()
    assert line.state == "refused" and line.reason == "queue_deadline"


def test_a_slot_waiting_for_an_online_head_of_several_sequences_is_never_a_batch_lines():
    q = make(limit=2, share=1.0)
    lines = batch(3)
    for e in lines:
        q.submit(e)
    wide = Entry("web", sequences=2)
    q.submit(wide)
    q.finish(lines[0])  # one slot free: the online head needs two, and the slot waits for it
    assert lines[2].state == "queued" and wide.state == "queued"
    q.finish(lines[1])
    assert wide.state == "running" and lines[2].state == "queued"
