"""LoadShedder: lower priorities are refused first, up to hard bounds that hold for everyone."""

import pytest
from pydantic import ValidationError

from loraplex.engine.shedding import EngineLoad, LoadShedder, SheddingConfig


def shedder(load: EngineLoad, **config) -> LoadShedder:
    return LoadShedder(SheddingConfig(**config), lambda: load)


def test_priorities_are_shed_lowest_first_by_queue_length():
    load = EngineLoad(waiting=40, kv_usage=0.1)
    s = shedder(load, shed_waiting=16, max_waiting=64)
    # Thresholds: p0 at 16, p50 at 40, p100 at 64 waiting.
    assert "40 requests are queued" in s.refusal(0)
    assert s.refusal(49) is not None and s.refusal(50) is not None
    assert s.refusal(51) is None and s.refusal(100) is None
    load.waiting = 64
    assert s.refusal(100) is not None  # the hard bound holds for every priority
    assert s.shed == 4


def test_kv_cache_usage_sheds_too():
    s = shedder(EngineLoad(waiting=0, kv_usage=0.97), shed_kv_usage=0.9, max_kv_usage=1.0)
    assert "97% full" in s.refusal(0)
    assert s.refusal(60) is not None  # 0.9 + 0.1 * 0.6 = 0.96 <= 0.97
    assert s.refusal(80) is None  # 0.98


def test_an_idle_replica_admits_everyone_and_disabled_admits_always():
    assert shedder(EngineLoad(0, 0.0)).refusal(0) is None
    assert shedder(EngineLoad(10_000, 1.0), enabled=False).refusal(0) is None


def test_the_load_is_read_once_per_sample_period():
    reads = []

    def read():
        reads.append(1)
        return EngineLoad(0, 0.0)

    s = LoadShedder(SheddingConfig(sample_period_s=60), read)
    for _ in range(100):
        s.refusal(0)
    assert len(reads) == 1


def test_bounds_must_be_ordered():
    with pytest.raises(ValidationError):
        SheddingConfig(shed_waiting=10, max_waiting=5)
