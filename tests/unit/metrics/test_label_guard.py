"""The cardinality guard: 1,000 tenants never make more than N+1 tenant series per metric."""

from datetime import datetime, timezone

import pytest

from fake_sink import FakeSink
from loraplex.accounting.record import UsageRecord
from loraplex.contract import RequestUsage
from loraplex.metrics import catalog as c
from loraplex.metrics.config import MetricsConfig
from loraplex.metrics.label_guard import LabelGuard
from loraplex.metrics.request_metrics import RequestMetrics

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc).timestamp()


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def record(tenant, adapter=None, prompt=10, completion=5, status="stop") -> UsageRecord:
    return UsageRecord(request_id=f"r-{tenant}-{adapter}-{prompt}", tenant_id=tenant, base_model="m",
                       prompt_tokens=prompt, cached_prompt_tokens=2, completion_tokens=completion, status=status,
                       arrival_time=NOW, first_token_time=NOW + 0.2, finish_time=NOW + 1.0, adapter=adapter)


def usage(completion=5) -> RequestUsage:
    return RequestUsage(completion_tokens=completion, first_token_time=NOW + 0.2, finish_time=NOW + 1.0,
                        scheduled_time=NOW + 0.1)


@pytest.mark.parametrize("n", [1, 10, 100])
def test_a_thousand_tenants_make_at_most_n_plus_one_tenant_series_per_metric(n):
    sink = FakeSink()
    metrics = RequestMetrics(MetricsConfig(max_tenant_labels=n, max_adapter_labels=n), sink)
    for i in range(1000):
        tenant = f"ten_{i:04d}"
        metrics.finished(record(tenant, adapter="bot@1" if i % 3 == 0 else None), usage(), NOW)
        metrics.refused(tenant, "429:rate_limit_requests")
    metrics.flush()
    for spec in c.REQUEST_METRICS + (c.REFUSALS,):
        tenants = sink[spec.name].label_values(c.TENANT)
        assert len(tenants) <= n + 1, (spec.name, len(tenants))
        assert c.OTHER in tenants
    # Nothing is lost: `other` carries the rest.
    assert sink[c.REQUESTS.name].total() == 1000
    assert sink[c.PROMPT_TOKENS.name].total() == 10 * 1000
    assert sink[c.TTFT.name].total() == 1000
    # An `other` tenant's adapter is `other` too; adapters stay bounded.
    adapters = sink[c.PROMPT_TOKENS.name].label_values(c.ADAPTER)
    assert adapters <= {"bot@1", c.BASE, c.OTHER}


def test_every_tenant_keeps_its_id_while_there_are_no_more_than_n():
    sink = FakeSink()
    metrics = RequestMetrics(MetricsConfig(max_tenant_labels=100), sink)
    for i in range(100):
        metrics.finished(record(f"ten_{i}"), usage(), NOW)
    metrics.flush()
    assert sink[c.COMPLETION_TOKENS.name].label_values(c.TENANT) == {f"ten_{i}" for i in range(100)}


def test_the_busiest_tenants_take_the_labels_at_the_next_window():
    clock = Clock()
    guard = LabelGuard(2, window_s=60, clock=clock)
    assert guard.keep("ten_a", 1) and guard.keep("ten_b", 1)  # free slots: labelled at once
    assert not guard.keep("ten_c", 500)  # full: `other` for the rest of the window
    clock.t = 61
    assert guard.keep("ten_c", 500)  # re-ranked: ten_c was the busiest of the window
    assert guard.kept == {"ten_c", "ten_a"} or guard.kept == {"ten_c", "ten_b"}
    assert len(guard.kept) == 2


def test_labels_stay_put_when_nobody_under_other_was_busy():
    clock = Clock()
    guard = LabelGuard(2, window_s=60, clock=clock)
    guard.keep("ten_a", 10)
    guard.keep("ten_b", 1)
    clock.t = 61
    guard.keep("ten_a", 10)  # a window without any `other` traffic: no re-ranking churn
    clock.t = 200
    assert guard.keep("ten_b", 0) and guard.keep("ten_a", 0)
    assert guard.kept == {"ten_a", "ten_b"}


def test_a_busy_tenant_keeps_its_label_over_an_idle_newcomer():
    clock = Clock()
    guard = LabelGuard(1, window_s=60, clock=clock)
    guard.keep("ten_big", 1000)
    assert not guard.keep("ten_small", 1)
    clock.t = 61
    assert not guard.keep("ten_small", 1)
    assert guard.kept == {"ten_big"}


def test_the_guard_needs_a_slot():
    with pytest.raises(ValueError):
        LabelGuard(0)
