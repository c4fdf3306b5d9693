"""RequestMetrics, the Meter that feeds it, and the status mapping, with a fake sink at the Ray edge."""

from datetime import datetime, timezone

import pytest

from fake_sink import FakeSink
from loraplex.accounting.record import STATUSES
from loraplex.engine.metering import Meter
from loraplex.contract import AdapterTarget, EngineCall, RequestUsage
from loraplex.metrics.recorder import DISABLED, Metrics
from loraplex.metrics import catalog as c
from loraplex.metrics.config import MetricsConfig
from loraplex.metrics.request_metrics import OUTCOMES, outcome
from loraplex.metrics.replica_metrics import NoReplicaMetrics
from loraplex.metrics.request_metrics import NoRequestMetrics, RequestMetrics

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc).timestamp()
BOT = AdapterTarget("ten_a/bot@abc", 7, "ten_a", "bot", "abc", requested_as="bot", version=2)


class FakeLedger:
    def __init__(self):
        self.records = []

    def append(self, record):
        self.records.append(record)


def call(request_id="r1", tenant="ten_a", adapter=None, base_model=None) -> EngineCall:
    return EngineCall(request_id=request_id, tenant_id=tenant, adapter=adapter, arrival_time=T0,
                      base_model=base_model)


def finished_usage(prompt=12, cached=8, completion=5, status="stop") -> RequestUsage:
    u = RequestUsage(prompt_tokens=prompt, cached_prompt_tokens=cached, completion_tokens=completion, status=status,
                     first_token_time=T0 + 0.5, finish_time=T0 + 1.5, scheduled_time=T0 + 0.25)
    u._completion_by_output = {"e0": {0: completion, "cached": cached}}
    return u


@pytest.fixture
def recorded():
    sink, ledger = FakeSink(), FakeLedger()
    meter = Meter(ledger, RequestMetrics(MetricsConfig(), sink), "base-model")
    return sink, ledger, meter


def flushed(meter):
    meter.metrics.flush()  # what the publisher does every period


def test_the_token_counters_are_the_usage_records_numbers(recorded):
    sink, ledger, meter = recorded
    meter(call("r1"), finished_usage(12, 8, 5))
    meter(call("r2", adapter=BOT), finished_usage(30, 0, 7, status="length"))
    meter(call("r3", tenant="ten_b"), finished_usage(4, 0, 1, status="client_disconnect"))
    assert sink[c.PROMPT_TOKENS.name].total() == 0  # added up in memory until the publisher flushes
    flushed(meter)
    for tenant in ("ten_a", "ten_b"):
        rows = [r for r in ledger.records if r.tenant_id == tenant]
        assert sink[c.PROMPT_TOKENS.name].total(tenant=tenant) == sum(r.prompt_tokens for r in rows)
        assert sink[c.CACHED_PROMPT_TOKENS.name].total(tenant=tenant) == sum(r.cached_prompt_tokens for r in rows)
        assert sink[c.COMPLETION_TOKENS.name].total(tenant=tenant) == sum(r.completion_tokens for r in rows)
    # Labels: the tenant id, and the record's adapter (name@version) or `base`.
    assert sink[c.PROMPT_TOKENS.name].total(tenant="ten_a", adapter="bot@2") == 30
    assert sink[c.PROMPT_TOKENS.name].total(tenant="ten_a", adapter=c.BASE) == 12
    requests = sink[c.REQUESTS.name]
    assert requests.total(tenant="ten_a", status="ok") == 1 and requests.total(tenant="ten_a", status="length") == 1
    assert requests.total(tenant="ten_b", status="client_disconnect") == 1


def test_every_request_metric_carries_the_records_base_model(recorded):
    sink, ledger, meter = recorded
    meter(call("r1"), finished_usage(12, 8, 5))  # no base named: the meter's (the config's first)
    meter(call("r2", base_model="big"), finished_usage(30, 10, 7))
    flushed(meter)
    assert [r.base_model for r in ledger.records] == ["base-model", "big"]
    for spec in c.REQUEST_METRICS:
        assert sink[spec.name].label_values(c.MODEL) == {"base-model", "big"}, spec.name
    assert sink[c.PROMPT_TOKENS.name].total(tenant="ten_a", model="big") == 30
    assert sink[c.PROMPT_TOKENS.name].total(tenant="ten_a", model="base-model") == 12


def test_the_histograms_time_the_request_from_its_arrival(recorded):
    sink, _, meter = recorded
    meter(call(), finished_usage(completion=5))
    tags = ((c.ADAPTER, c.BASE), (c.MODEL, "base-model"), (c.TENANT, "ten_a"))
    assert sink[c.TTFT.name].observations[tags] == [pytest.approx(0.5)]
    assert sink[c.E2E.name].observations[tags] == [pytest.approx(1.5)]
    assert sink[c.QUEUE.name].observations[tags] == [pytest.approx(0.25)]
    assert sink[c.TPOT.name].observations[tags] == [pytest.approx(1.0 / 4)]  # 4 tokens after the first


def test_time_per_output_token_divides_by_the_longest_choice_not_all_choices(recorded):
    sink, _, meter = recorded
    u = finished_usage(completion=10)
    u._completion_by_output = {"e0": {0: 5, 1: 5}}  # n=2: two choices decoded side by side
    meter(call(), u)
    [tpot] = sink[c.TPOT.name].observations[((c.ADAPTER, c.BASE), (c.MODEL, "base-model"), (c.TENANT, "ten_a"))]
    assert tpot == pytest.approx(1.0 / 4)


def test_a_request_without_a_first_token_or_schedule_observes_only_its_latency(recorded):
    sink, _, meter = recorded
    u = RequestUsage(prompt_tokens=3, status="engine_error", finish_time=T0 + 2.0)
    meter(call(), u)
    flushed(meter)
    assert sink[c.E2E.name].total() == 1
    assert sink[c.TTFT.name].total() == sink[c.TPOT.name].total() == sink[c.QUEUE.name].total() == 0
    assert sink[c.REQUESTS.name].total(status="error") == 1
    assert sink[c.COMPLETION_TOKENS.name].total() == 0  # no zero increment (Ray refuses those)


def test_a_clock_skewed_first_token_never_observes_a_negative_time(recorded):
    sink, _, meter = recorded
    u = finished_usage()
    u.first_token_time = u.scheduled_time = T0 - 0.3  # the engine host's clock is behind the ingress's
    meter(call(), u)
    assert min(min(v) for v in sink[c.TTFT.name].observations.values()) == 0.0
    assert min(min(v) for v in sink[c.QUEUE.name].observations.values()) == 0.0


def test_refusals_carry_the_ledgers_reason_and_what_was_known_of_the_request():
    sink = FakeSink()
    metrics = RequestMetrics(MetricsConfig(), sink, "base-model")
    metrics.refused(None, "401")
    metrics.refused("ten_a", "404")  # refused before its model resolved
    metrics.refused("ten_a", "429:rate_limit_tokens", call(adapter=BOT))
    metrics.refused("ten_a", "503:shed", call())
    metrics.refused("ten_a", "503:shed", call(base_model="big"))
    metrics.flush()
    metrics.flush()  # nothing new: nothing added twice
    refusals = sink[c.REFUSALS.name]
    assert refusals.total(tenant=c.UNKNOWN, adapter=c.UNKNOWN, model=c.UNKNOWN, reason="401") == 1
    assert refusals.total(tenant="ten_a", adapter=c.UNKNOWN, model=c.UNKNOWN, reason="404") == 1
    assert refusals.total(tenant="ten_a", adapter="bot@2", model="base-model", reason="429:rate_limit_tokens") == 1
    # The call's base, else the replica's default one (the config's first).
    assert refusals.total(tenant="ten_a", adapter=c.BASE, model="base-model", reason="503:shed") == 1
    assert refusals.total(tenant="ten_a", adapter=c.BASE, model="big", reason="503:shed") == 1


def test_a_failing_metric_never_fails_the_bill():
    class Broken:
        def finished(self, *args):
            raise RuntimeError("exporter gone")

    ledger = FakeLedger()
    Meter(ledger, Broken(), "m")(call(), finished_usage())
    assert len(ledger.records) == 1


@pytest.mark.parametrize("status", sorted(STATUSES))
def test_every_ledger_status_maps_to_one_of_the_five_outcomes(status):
    assert outcome(status) in OUTCOMES


def test_the_status_mapping():
    assert [outcome(s) for s in ("stop", "finished", "length", "client_disconnect", "timeout", "error",
                                 "engine_error", "aborted", "something_new", None)] == [
        "ok", "ok", "length", "client_disconnect", "timeout", "error", "error", "error", "error", "error"]


def test_metrics_off_builds_no_recorder_at_all():
    sink = FakeSink()
    metrics = Metrics.for_replica(MetricsConfig(enabled=False), "engine", sink)
    assert isinstance(metrics.requests, NoRequestMetrics) and isinstance(metrics.replica, NoReplicaMetrics)
    assert sink.metrics == {}  # nothing registered with Ray
    Meter(FakeLedger(), metrics.requests, "m")(call(), finished_usage())
    assert not DISABLED.enabled


def test_metrics_on_registers_every_metric_of_its_role():
    engine, ingress = FakeSink(), FakeSink()
    Metrics.for_replica(MetricsConfig(), "engine", engine, base_model="qwen")
    Metrics.for_replica(MetricsConfig(), "ingress", ingress)
    request_names = {s.name for s in c.REQUEST_METRICS + c.SLO_METRICS + (c.REFUSALS,)}
    assert set(engine.metrics) == request_names | {s.name for s in c.ENGINE_METRICS + c.LEDGER_METRICS}
    assert set(ingress.metrics) == request_names | {c.ROUTING_DECISIONS.name, c.MIGRATIONS.name, c.DATABASE_REACHABLE.name} | {
        s.name for s in c.LEDGER_METRICS}


def test_attainment_and_goodput_per_class_and_tenant(recorded):
    """TTFT 0.5 s and TPOT 0.25 s (finished_usage): within a 1 s / 0.3 s class, not a 0.25 s TTFT one."""
    from dataclasses import replace
    from loraplex.contract import SloTargets
    sink, _, meter = recorded
    loose, tight = SloTargets("chat", 1.0, 0.3), SloTargets("interactive", 0.25, 0.3)
    meter(replace(call("r1"), slo=loose), finished_usage(completion=5))
    meter(replace(call("r2"), slo=tight), finished_usage(completion=5))
    meter(replace(call("r3", tenant="ten_b"), slo=loose), finished_usage(completion=5, status="error"))
    meter(call("r4"), finished_usage(completion=5))  # no class: not counted
    flushed(meter)
    slo = sink[c.SLO_REQUESTS.name]
    assert slo.total(tenant="ten_a", slo_class="chat", met="true") == 1
    assert slo.total(tenant="ten_a", slo_class="interactive", met="false") == 1
    assert slo.total(tenant="ten_b", slo_class="chat", met="false") == 1  # an error is never within its SLO
    assert slo.total() == 3
    goodput = sink[c.GOODPUT_TOKENS.name]
    assert goodput.total(slo_class="chat") == 5 and goodput.total() == 5
