"""bench/percentile.py: the one percentile every benchmark prints is numpy's linear one (what
`vllm bench serve` reports), so two tables on the same data cannot disagree."""
import numpy as np
import pytest

from bench.percentile import or_nan, percentile


@pytest.mark.parametrize("q", [0, 1, 25, 50, 90, 95, 99, 100])
@pytest.mark.parametrize("xs", [[3.0], [1.0, 2.0], [5, 1, 4, 2, 3], list(np.random.default_rng(0).exponential(size=101))])
def test_percentile_matches_numpy_linear(xs, q):
    assert percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)))


def test_percentile_edge_cases():
    assert percentile([], 50) is None
    assert percentile([None, 2.0, None], 95) == 2.0  # failed requests have no TTFT
    assert percentile([1, 2, 3, 4], 50) == 2.5
    with pytest.raises(ValueError):
        percentile([1], 101)
    assert np.isnan(or_nan(percentile([], 50))) and or_nan(2.0) == 2.0
