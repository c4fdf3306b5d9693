"""The fair queue counts sequences (Entry.sequences: n x prompts), not requests (issue 34): a
request of n choices or a batch of prompts takes as many of the dispatch limit's slots."""

from loraplex.engine.config import FairQueueConfig
from loraplex.engine.dispatch_limit import FixedLimit
from loraplex.engine.fair_queue import Entry, FairQueue


def make(limit=4, max_num_seqs=8, **cfg):
    return FairQueue(FairQueueConfig(**{"newcomer_slots": 0, **cfg}), FixedLimit(limit), max_num_seqs,
                     clock=lambda: 1000.0, wall=lambda: 1000.0)


def test_a_request_of_several_sequences_takes_as_many_slots():
    q = make(limit=4)
    big = Entry("a", sequences=3)
    q.submit(big)
    assert big.state == "running" and q.running == 3 and q.tenants["a"].running == 3
    two = Entry("b", sequences=2)
    q.submit(two)
    assert two.state == "queued"  # 3 + 2 > 4: counted as one request it would have run
    one = Entry("c")
    q.submit(one)
    assert one.state == "queued"  # the slot waits for b's head (it is next by VTC), not given to single ones
    q.finish(big)
    assert two.state == "running" and one.state == "running" and q.running == 3
    q.finish(two)
    q.finish(one)
    assert q.running == 0 and q.tenants == {} or all(t.running == 0 for t in q.tenants.values())


def test_a_request_over_the_limit_waits_for_the_whole_limit_then_runs():
    q = make(limit=4)
    small = Entry("a")
    q.submit(small)
    huge = Entry("b", sequences=24)  # more than the limit: never stuck, it needs all 4
    q.submit(huge)
    assert huge.state == "queued"
    q.finish(small)
    assert huge.state == "running" and q.running == 24
    later = Entry("a")
    q.submit(later)
    assert later.state == "queued"  # the replica is full of b's sequences
    q.finish(huge)
    assert later.state == "running"


def test_reserved_slots_count_sequences_against_the_tenants_share():
    q = make(limit=2, newcomer_slots=2)
    for _ in range(2):
        q.submit(Entry("heavy"))
    q.submit(Entry("heavy"))  # heavy is backlogged
    batch = Entry("light", sequences=2)
    q.submit(batch)
    # light's share of the limit is 1: a 2-sequence request is over it, no reserved slot
    assert batch.state == "queued"
    single = Entry("other")
    q.submit(single)
    assert single.state == "running" and single.reserved  # a single one still takes a reserved slot


def test_an_arrival_held_for_a_wide_head_runs_once_that_head_is_gone():
    q = make(limit=4)
    q.submit(Entry("a", sequences=3))
    wide = Entry("b", sequences=2, deadline=1030.0)
    q.submit(wide)
    behind = Entry("b")  # b's next, behind its wide head
    q.submit(behind)
    assert wide.state == "queued" and behind.state == "queued"
    q.wall = lambda: 1030.0  # b's wide head expires: its slot no longer waits for anyone
    one = Entry("c")
    q.submit(one)
    assert wide.state == "refused"
    assert behind.state == "running" or one.state == "running"  # the free slot is taken, not left idle
