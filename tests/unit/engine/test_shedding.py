"""LoadShedder: the tenant over its share is refused, never the one under it; lower priorities
first, up to hard bounds that hold for everyone."""

import pytest
from pydantic import ValidationError

from loraplex.engine.config import SheddingConfig
from loraplex.engine.shedding import InFlight, LoadShedder


def loaded(weight: float = 1.0, **held: int) -> InFlight:
    load = InFlight()
    for tenant, n in held.items():
        load.add(tenant, weight, n)
    return load


class HeavyShedder(LoadShedder):
    """Every sequence in flight is tenant "heavy"'s, and it asks again: over any share."""

    def refusal(self, priority: int, **kw):
        return super().refusal("heavy", priority, **kw)


def shedder(load: InFlight, kv: float = 0.1, **config) -> LoadShedder:
    return HeavyShedder(SheddingConfig(**config), load, lambda: kv)


def test_priorities_are_shed_lowest_first_by_requests_in_flight():
    load = loaded(heavy=40)
    s = shedder(load, shed_requests=16, max_requests=64)
    # Thresholds: p0 at 16, p50 at 40, p100 at 64 in flight.
    assert "40 sequences are in flight" in s.refusal(0)
    assert s.refusal(49) is not None and s.refusal(50) is not None
    assert s.refusal(51) is None and s.refusal(100) is None
    load.add("heavy", 1.0, 24)  # 64
    assert s.refusal(100) is not None  # the hard bound holds for every priority
    assert s.shed == 4


def test_kv_cache_usage_sheds_too():
    s = shedder(loaded(heavy=1), kv=0.97, shed_kv_usage=0.9, max_kv_usage=1.0)
    assert "97% full" in s.refusal(0)
    assert s.refusal(60) is not None  # 0.9 + 0.1 * 0.6 = 0.96 <= 0.97
    assert s.refusal(80) is None  # 0.98


def test_an_idle_replica_admits_everyone_and_disabled_admits_always():
    assert shedder(InFlight(), kv=0.0).refusal(0) is None
    assert shedder(loaded(heavy=10_000), kv=1.0, enabled=False).refusal(0) is None


def test_the_kv_gauge_is_read_once_per_sample_period():
    reads = []
    s = LoadShedder(SheddingConfig(sample_period_s=60), InFlight(), lambda: reads.append(1) or 0.0)
    for _ in range(100):
        s.refusal("a", 0)
    assert len(reads) == 1


def test_bounds_must_be_ordered():
    with pytest.raises(ValidationError):
        SheddingConfig(shed_requests=10, max_requests=5)


def test_a_ladder_by_priority_sheds_the_middle_early_and_keeps_the_top_deep():
    load = loaded(heavy=1)
    s = shedder(load, requests_by_priority={0: 1, 50: 2, 100: 8})
    assert s.refusal(0) is not None and s.refusal(50) is None  # p0 refused at 1 in flight
    load.add("heavy", 1.0, 1)  # 2
    assert s.refusal(50) is not None and s.refusal(60) is None  # 2 + 6 x 0.2 = 3.2
    load.add("heavy", 1.0, 5)  # 7
    assert s.refusal(83) is not None and s.refusal(99) is None  # 5.96 and 7.88 vs 7
    load.add("heavy", 1.0, 1)  # 8
    assert s.refusal(100) is not None


def test_a_ladder_holds_its_ends_outside_the_listed_priorities():
    config = SheddingConfig(requests_by_priority={20: 4, 80: 10})
    assert config.requests_limit(0) == 4 and config.requests_limit(20) == 4
    assert config.requests_limit(50) == 7
    assert config.requests_limit(100) == 10 and config.requests_limit(80) == 10


@pytest.mark.parametrize("ladder", [{}, {0: 5, 50: 3}, {101: 3}, {0: -1}])
def test_a_ladder_must_be_valid(ladder):
    with pytest.raises(ValidationError):
        SheddingConfig(requests_by_priority=ladder)


# -- by share: the tenant over its share is refused, the one under it admitted ---------------------
def test_a_full_replica_admits_the_tenant_under_its_share_and_refuses_the_one_over_it():
    # 48 in flight (shed_requests) all of tenant A's: the replica is full for priority 0. B holds
    # nothing: its share of 48 beside A is 24, so B is admitted (the old rule refused it); A is not.
    load = loaded(A=48)
    s = LoadShedder(SheddingConfig(shed_requests=48, max_requests=128), load, lambda: 0.1)
    assert s.refusal("B", 0) is None
    assert s.refusal("B", 0, sequences=24) is None  # within its share, this request's included
    refused = s.refusal("A", 0)
    assert refused is not None and "your tenant would hold 49 of them, over its share of 48" in refused  # alone: all
    assert s.refusal("B", 0, sequences=25) is not None  # one request past its share
    assert s.shed == 2


def test_shares_follow_the_weights_and_count_every_tenant_holding_sequences():
    load = InFlight()
    load.add("A", 1.0, 30)
    load.add("B", 1.0, 10)
    load.add("C", 2.0, 8)  # 48 in all
    s = LoadShedder(SheddingConfig(shed_requests=48), load, lambda: 0.1)
    # Shares of 48 by weight 1:1:2 (+ D's 1 when D asks): A 12, B 12, C 24; D 9 (48 x 1 / 5).
    assert s.refusal("C", 0, weight=2.0, sequences=16) is None  # 8 + 16 = 24
    assert s.refusal("C", 0, weight=2.0, sequences=17) is not None
    assert s.refusal("B", 0, sequences=2) is None and s.refusal("B", 0, sequences=3) is not None  # share 12
    assert s.refusal("A", 0) is not None  # 30 held, share 12
    assert s.refusal("D", 0, sequences=9) is None and s.refusal("D", 0, sequences=10) is not None  # 48 / 5


def test_the_kv_cache_full_splits_what_is_in_flight():
    # The KV cache is what is full (30 in flight, under the count): shares are of the 30.
    s = LoadShedder(SheddingConfig(shed_kv_usage=0.9), loaded(A=30), lambda: 0.95)
    assert s.refusal("B", 0, sequences=15) is None and s.refusal("B", 0, sequences=16) is not None
    assert "KV cache is 95% full" in s.refusal("A", 0)


def test_past_the_bounds_that_hold_for_all_even_a_tenant_under_its_share_is_refused():
    s = LoadShedder(SheddingConfig(shed_requests=16, max_requests=64), loaded(A=64), lambda: 0.1)
    assert s.refusal("B", 0) is not None  # 64: the top priority's count
    s = LoadShedder(SheddingConfig(), loaded(A=4), lambda: 1.0)
    assert s.refusal("B", 100) is not None  # max_kv_usage


def test_in_flight_forgets_a_tenant_with_nothing_left():
    load = loaded(A=3)
    load.add("B", 2.0, 1)
    load.remove("A", 3)
    assert load.total == 1 and load.sequences == {"B": 1} and load.weights == {"B": 2.0}


def test_a_priority_ladder_still_refuses_a_low_priority_once_higher_ones_fill_its_count():
    # {0: 1, ...}: priority 0 is refused once the replica holds one sequence. A gold tenant's
    # sequence leaves a bronze newcomer no room (its share is what higher priorities leave).
    load = InFlight()
    load.add("gold", 1.0, 1, priority=100)
    s = LoadShedder(SheddingConfig(requests_by_priority={0: 1, 50: 2, 100: 8}), load, lambda: 0.1)
    assert "over its share of 0" in s.refusal("bronze", 0)
    assert s.refusal("silver", 50) is None  # its own count (2) is not reached
    # Among equals the newcomer gets its share: a second bronze beside the first one's sequence.
    load = loaded(bronze=1)
    s = LoadShedder(SheddingConfig(requests_by_priority={0: 2, 100: 8}), load, lambda: 0.1)
    load.add("bronze", 1.0, 1)  # 2: full for priority 0
    assert s.refusal("bronze2", 0) is None and s.refusal("bronze", 0) is not None
    # A lower priority's sequences do not shrink a higher one's room.
    load = loaded(bronze=8)
    s = LoadShedder(SheddingConfig(requests_by_priority={0: 1, 50: 4, 100: 16}), load, lambda: 0.1)
    assert s.refusal("silver", 50, sequences=4) is None and s.refusal("silver", 50, sequences=5) is not None
