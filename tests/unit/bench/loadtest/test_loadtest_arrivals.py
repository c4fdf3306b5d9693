"""Open-loop arrivals: Poisson at a rate, gamma burstiness (vllm bench serve's convention)."""
import math
import random
import statistics

import pytest

from bench.loadtest.arrivals import arrival_offsets, interarrival_gaps


def cv(xs):
    return statistics.pstdev(xs) / statistics.fmean(xs)


def test_poisson_gaps_have_mean_one_over_rate_and_cv_one():
    gaps = interarrival_gaps(20_000, rate=4.0, burstiness=1.0, rng=random.Random(1))
    assert statistics.fmean(gaps) == pytest.approx(0.25, rel=0.03)
    assert cv(gaps) == pytest.approx(1.0, rel=0.05)
    # Exponential: P(gap > mean) = e^-1
    assert sum(g > 0.25 for g in gaps) / len(gaps) == pytest.approx(math.exp(-1), abs=0.015)


@pytest.mark.parametrize("burstiness", [0.25, 4.0])
def test_burstiness_keeps_the_rate_and_sets_the_spread(burstiness):
    gaps = interarrival_gaps(40_000, rate=2.0, burstiness=burstiness, rng=random.Random(2))
    assert statistics.fmean(gaps) == pytest.approx(0.5, rel=0.04)
    assert cv(gaps) == pytest.approx(1 / math.sqrt(burstiness), rel=0.06)


def test_counts_in_windows_are_poisson():
    # Arrivals of a Poisson process in unit windows: mean = variance = rate.
    offs = arrival_offsets(30_000, rate=5.0, rng=random.Random(3))
    counts = [0] * int(offs[-1])
    for t in offs:
        if int(t) < len(counts):
            counts[int(t)] += 1
    assert statistics.fmean(counts) == pytest.approx(5.0, rel=0.03)
    assert statistics.pvariance(counts) == pytest.approx(5.0, rel=0.1)


def test_offsets_start_at_zero_increase_and_are_reproducible():
    a = arrival_offsets(50, rate=10.0, burstiness=0.5, rng=random.Random(7))
    assert a[0] == 0.0 and all(x <= y for x, y in zip(a, a[1:]))
    assert a == arrival_offsets(50, rate=10.0, burstiness=0.5, rng=random.Random(7))
    assert arrival_offsets(3, rate=math.inf) == [0.0, 0.0, 0.0]
    assert arrival_offsets(0, rate=1.0) == []


def test_bad_parameters_are_refused():
    with pytest.raises(ValueError):
        interarrival_gaps(3, rate=0)
    with pytest.raises(ValueError):
        interarrival_gaps(3, rate=1, burstiness=0)
