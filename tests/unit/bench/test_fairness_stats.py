"""bench/fairness.py's arithmetic: the max-min fair allocation, Jain's index, Zipf demand."""

import pytest

from bench.fairness import jain, max_min_fair, zipf_rates


def test_max_min_fair_fills_small_demands_and_splits_the_rest():
    assert max_min_fair([1, 2, 10], 9) == [1, 2, 6]
    assert max_min_fair([5, 5], 4) == [2, 2]
    assert max_min_fair([1, 1], 10) == [1, 1]  # more capacity than demand: everyone's demand


def test_jain_is_one_at_the_fair_allocation_and_falls_with_unfairness():
    fair = [1, 2, 6]
    assert jain(fair, fair) == pytest.approx(1.0)
    assert jain([0.5, 1, 3], fair) == pytest.approx(1.0)  # the same share each: still fair
    assert jain([1, 2, 0], fair) < 0.7


def test_zipf_rates_sum_to_the_total_and_fall_by_rank():
    rates = zipf_rates(20, 4.0)
    assert sum(rates) == pytest.approx(4.0)
    assert rates[0] == pytest.approx(2 * rates[1])
