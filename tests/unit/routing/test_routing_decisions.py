"""The routing decision each generation call gets, counted in the ingress's metrics."""

import sys
from pathlib import Path

import pytest

from loraplex.contract import EngineCall
from loraplex.metrics import recorder as process
from loraplex.metrics.recorder import Metrics
from loraplex.metrics import catalog as c
from loraplex.metrics.config import MetricsConfig
from loraplex.routing.rendezvous import rendezvous_order
from loraplex.routing.decision import AFFINITY, FALLBACK, NEW_KEY, RANKED, SPILL, routing_decision
from test_routing_serve_router import Broken, Chat, fleet, logged, make_router, route, tenant_call  # noqa: F401

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "metrics"))
from fake_sink import FakeSink  # noqa: E402


def test_the_decision_from_the_holders_and_the_chosen_replica():
    assert routing_decision("r1", {"r1", "r2"}) == AFFINITY
    assert routing_decision("r3", {"r1"}) == SPILL
    assert routing_decision("r3", set()) == NEW_KEY
    assert routing_decision("r3", None) == RANKED


class Decisions:
    """The routing-decisions counter as the next publish would export it."""

    def __init__(self, metrics, sink):
        self.metrics, self.counter = metrics, sink[c.ROUTING_DECISIONS.name]

    def total(self, **labels):
        self.metrics.flush()
        return self.counter.total(**labels)


@pytest.fixture
def decisions():
    sink = FakeSink()
    metrics = Metrics.for_replica(MetricsConfig(), "ingress", sink)
    process.install(metrics)
    yield Decisions(metrics, sink)
    process.install(Metrics.for_replica(MetricsConfig(enabled=False), "ingress"))


async def test_a_new_key_then_affinity_then_spill_when_its_home_is_over_the_bound(decisions):
    router = make_router(fleet(4), load_factor=1.25, min_bound=0)
    await route(router, *tenant_call("ten_a"))
    assert decisions.total(decision=NEW_KEY) == 1
    await route(router, *tenant_call("ten_a"))
    assert decisions.total(decision=AFFINITY) == 1
    # A hot key: its holders fill up to the bound, then it spills onto the next replicas.
    for _ in range(20):
        await route(router, *tenant_call("ten_a"), complete=False)
    assert decisions.total(decision=SPILL) > 0
    assert decisions.total() == 22


async def test_calls_without_a_key_or_with_a_failing_policy_are_fallbacks(decisions, logged):
    router = make_router(fleet(3), min_bound=0)
    await route(router, EngineCall("q1"), Chat())  # no routing key
    assert decisions.total(decision=FALLBACK) == 1
    router._policy = Broken()
    await route(router, *tenant_call("ten_a"))
    assert decisions.total(decision=FALLBACK) == 2


async def test_only_generation_calls_are_counted(decisions):
    router = make_router(fleet(3), min_bound=0)
    await route(router)  # a health probe, base_models, ...: no EngineCall
    assert decisions.total() == 0


async def test_without_metrics_routing_records_nothing_and_still_routes():
    process.install(Metrics.for_replica(MetricsConfig(enabled=False), "ingress"))
    router = make_router(fleet(3), min_bound=0)
    assert await route(router, *tenant_call("ten_a")) == rendezvous_order("ten_a", ["r0", "r1", "r2"])[0]
