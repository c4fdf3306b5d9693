"""Histogram buckets: OpenTelemetry's GenAI advice, and quantiles meaningful from 10 ms to 60 s."""

import pytest

from loraplex.metrics import catalog as b
from loraplex.metrics import catalog as c


@pytest.mark.parametrize("spec, otel", [(c.TTFT, b.OTEL_TIME_TO_FIRST_TOKEN), (c.TPOT, b.OTEL_TIME_PER_OUTPUT_TOKEN),
                                        (c.E2E, b.OTEL_REQUEST_DURATION)])
def test_the_buckets_keep_opentelemetrys_boundaries_from_10_ms_up(spec, otel):
    assert {x for x in otel if x >= 0.01} <= set(spec.buckets)


@pytest.mark.parametrize("spec, top", [(c.TTFT, 60.0), (c.E2E, 60.0), (c.QUEUE, 60.0), (c.TPOT, 10.0),
                                       (c.ADAPTER_LOAD_SECONDS, 60.0)])
def test_quantiles_land_in_a_finite_bucket_no_wider_than_2_5x_from_10_ms_to_the_top(spec, top):
    bounds = spec.buckets
    assert list(bounds) == sorted(set(bounds)) and bounds[0] <= 0.01 and bounds[-1] >= top
    # Prometheus interpolates inside a bucket: a P95 read from [a, b] is off by at most b/a.
    for lo, hi in zip(bounds, bounds[1:]):
        if lo < top:
            assert hi / lo <= 2.5, (spec.name, lo, hi)


def test_every_histogram_has_buckets_and_nothing_else_does():
    for spec in c.ALL:
        assert bool(spec.buckets) == (spec.kind == "histogram"), spec.name
