"""LoadShedder: lower priorities are refused first, up to hard bounds that hold for everyone."""

import pytest
from pydantic import ValidationError

from loraplex.engine.shedding import LoadShedder, SheddingConfig


def shedder(in_flight: list, kv: float = 0.1, **config) -> LoadShedder:
    return LoadShedder(SheddingConfig(**config), lambda: in_flight[0], lambda: kv)


def test_priorities_are_shed_lowest_first_by_requests_in_flight():
    load = [40]
    s = shedder(load, shed_requests=16, max_requests=64)
    # Thresholds: p0 at 16, p50 at 40, p100 at 64 in flight.
    assert "40 sequences are in flight" in s.refusal(0)
    assert s.refusal(49) is not None and s.refusal(50) is not None
    assert s.refusal(51) is None and s.refusal(100) is None
    load[0] = 64
    assert s.refusal(100) is not None  # the hard bound holds for every priority
    assert s.shed == 4


def test_kv_cache_usage_sheds_too():
    s = shedder([0], kv=0.97, shed_kv_usage=0.9, max_kv_usage=1.0)
    assert "97% full" in s.refusal(0)
    assert s.refusal(60) is not None  # 0.9 + 0.1 * 0.6 = 0.96 <= 0.97
    assert s.refusal(80) is None  # 0.98


def test_an_idle_replica_admits_everyone_and_disabled_admits_always():
    assert shedder([0], kv=0.0).refusal(0) is None
    assert shedder([10_000], kv=1.0, enabled=False).refusal(0) is None


def test_the_kv_gauge_is_read_once_per_sample_period_and_the_count_every_time():
    reads, counts = [], []
    s = LoadShedder(SheddingConfig(sample_period_s=60), lambda: counts.append(1) or 0,
                    lambda: reads.append(1) or 0.0)
    for _ in range(100):
        s.refusal(0)
    assert len(reads) == 1 and len(counts) == 100


def test_bounds_must_be_ordered():
    with pytest.raises(ValidationError):
        SheddingConfig(shed_requests=10, max_requests=5)


def test_a_ladder_by_priority_sheds_the_middle_early_and_keeps_the_top_deep():
    load = [1]
    s = shedder(load, requests_by_priority={0: 1, 50: 2, 100: 8})
    assert s.refusal(0) is not None and s.refusal(50) is None  # p0 refused at 1 in flight
    load[0] = 2
    assert s.refusal(50) is not None and s.refusal(60) is None  # 2 + 6 x 0.2 = 3.2
    load[0] = 7
    assert s.refusal(83) is not None and s.refusal(99) is None  # 5.96 and 7.88 vs 7
    load[0] = 8
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
