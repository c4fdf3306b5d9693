"""A rate that rises and falls: its shape, and Poisson arrivals that follow it (time rescaling)."""
import random
import statistics

import pytest

from bench.loadtest.arrivals import RateProfile, profile_arrivals


def test_rise_and_fall_is_valley_peak_valley():
    p = RateProfile.rise_and_fall(valley=0.2, peak=1.0, duration_s=400)
    assert [p.rate(t) for t in (0, 50, 100, 150, 200, 250, 300, 400)] == pytest.approx(
        [0.2, 0.2, 0.2, 0.6, 1.0, 0.6, 0.2, 0.2])
    assert p.rate(401) == 0.0 and p.duration_s == 400
    # a quarter at 0.2, half a triangle from 0.2 to 1.0 (mean 0.6), a quarter at 0.2
    assert p.expected(400) == pytest.approx(100 * 0.2 + 200 * 0.6 + 100 * 0.2)


@pytest.mark.parametrize("n", [0.0, 3.0, 20.0, 45.5, 100.0, 159.9])
def test_time_of_inverts_expected(n):
    p = RateProfile.rise_and_fall(valley=0.2, peak=1.0, duration_s=400)
    assert p.expected(p.time_of(n)) == pytest.approx(n, abs=1e-9)
    assert p.time_of(161) == float("inf")


def test_zero_rate_stretches_are_skipped():
    p = RateProfile([(0, 0.0), (10, 0.0), (20, 2.0), (30, 0.0)])
    assert p.time_of(0.0) >= 10 and p.expected(p.time_of(7.0)) == pytest.approx(7.0)
    assert all(t >= 10 for t in profile_arrivals(p, random.Random(1)))


def test_arrivals_follow_the_profile_in_the_valleys_and_at_the_peak():
    p = RateProfile.rise_and_fall(valley=0.5, peak=5.0, duration_s=400)
    runs = [profile_arrivals(p, random.Random(seed)) for seed in range(40)]
    assert statistics.fmean(len(r) for r in runs) == pytest.approx(p.expected(400), rel=0.02)
    valley = statistics.fmean(sum(t < 100 for t in r) for r in runs)    # expected 50
    peak = statistics.fmean(sum(180 <= t < 220 for t in r) for r in runs)  # expected 40 x ~4.8
    assert valley == pytest.approx(50, rel=0.06)
    assert peak == pytest.approx(p.expected(220) - p.expected(180), rel=0.04)


def test_arrivals_are_sorted_in_the_profile_and_reproducible():
    p = RateProfile.rise_and_fall(valley=0.1, peak=1.0, duration_s=360)
    a = profile_arrivals(p, random.Random(7))
    assert a == sorted(a) and 0 <= a[0] and a[-1] <= 360
    assert a == profile_arrivals(p, random.Random(7))
    assert a != profile_arrivals(p, random.Random(8))


@pytest.mark.parametrize("points", [[(0, 1)], [(1, 1), (2, 1)], [(0, 1), (0, 2)], [(0, 1), (5, -1)]])
def test_bad_profiles_are_refused(points):
    with pytest.raises(ValueError):
        RateProfile(points)
