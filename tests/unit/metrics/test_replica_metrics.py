"""Per-replica metrics: vLLM's numbers re-exported, counters from 0, the one shared stats reader."""

from prometheus_client import CollectorRegistry, Counter, Gauge

from fake_sink import FakeSink
from loraplex.engine.engine_counters import EngineStatsReader, read_engine_counters
from loraplex.metrics import catalog as c
from loraplex.metrics.publisher import Publisher
from loraplex.metrics.replica_metrics import ReplicaMetrics


def vllm_registry():
    """A registry with vLLM's metric names, as its PrometheusStatLogger registers them."""
    reg = CollectorRegistry()
    labels = ["model_name", "engine"]
    metrics = {
        "preemptions": Counter("vllm:num_preemptions", "", labels, registry=reg),
        "queries": Counter("vllm:prefix_cache_queries", "", labels, registry=reg),
        "hits": Counter("vllm:prefix_cache_hits", "", labels, registry=reg),
        "kv": Gauge("vllm:kv_cache_usage_perc", "", labels, registry=reg),
        "running": Gauge("vllm:num_requests_running", "", labels, registry=reg),
        "waiting": Gauge("vllm:num_requests_waiting", "", labels, registry=reg),
        "lora": Gauge("vllm:lora_requests_info", "",
                      ["max_lora", "waiting_lora_adapters", "running_lora_adapters"], registry=reg),
    }
    return reg, {k: (m.labels("m", "0") if k != "lora" else m) for k, m in metrics.items()}


def test_counters_with_known_values_exist_at_zero_from_the_start():
    engine, ingress = FakeSink(), FakeSink()
    ReplicaMetrics(engine, "engine", "qwen")
    ReplicaMetrics(ingress, "ingress")
    for spec in (c.PREEMPTIONS, c.PREFIX_QUERIES, c.PREFIX_HITS, c.ADAPTER_LOADS):
        assert engine[spec.name].values == {((c.MODEL, "qwen"),): 0.0}
    assert engine[c.ADAPTER_EVICTIONS.name].label_values(c.REASON) == {"lru", "bytes", "deleted"}
    assert ingress[c.ROUTING_DECISIONS.name].label_values(c.DECISION) == set(c.ROUTING_DECISIONS.values[c.DECISION])
    assert c.PREEMPTIONS.name not in ingress.metrics  # an ingress has no engine


def test_vllms_counters_are_re_exported_by_what_they_grew_and_gauges_as_read():
    reg, m = vllm_registry()
    sink = FakeSink()
    replica = ReplicaMetrics(sink, "engine", "qwen")
    reader = EngineStatsReader(max_age_s=0, registry=reg)
    m["queries"].inc(100)
    m["hits"].inc(40)
    m["kv"].set(0.42)
    m["running"].set(3)
    m["waiting"].set(1)
    m["lora"].labels(max_lora="4", waiting_lora_adapters="", running_lora_adapters="a,b").set(1.0)
    m["lora"].labels(max_lora="4", waiting_lora_adapters="", running_lora_adapters="a,b,c").set(2.0)  # latest
    replica.engine_stats(reader.read())
    m["queries"].inc(28)
    m["preemptions"].inc(2)
    replica.engine_stats(reader.read())
    replica.engine_stats(reader.read())  # nothing grew: nothing added
    assert sink[c.PREFIX_QUERIES.name].total() == 128 and sink[c.PREFIX_HITS.name].total() == 40
    assert sink[c.PREEMPTIONS.name].total() == 2
    assert sink[c.KV_USAGE.name].total() == 0.42 and sink[c.RUNNING.name].total() == 3
    assert sink[c.WAITING.name].total() == 1
    assert sink[c.LOADED_ADAPTERS.name].total(tier="gpu") == 3


def test_one_reader_serves_every_caller_within_its_age():
    reg, m = vllm_registry()
    now = [0.0]
    reader = EngineStatsReader(max_age_s=0.25, registry=reg, clock=lambda: now[0])
    m["kv"].set(0.5)
    assert reader.read()["kv_cache_usage"] == 0.5
    m["kv"].set(0.9)
    now[0] = 0.1
    assert reader.read()["kv_cache_usage"] == 0.5  # shared reading
    assert reader.read(max_age_s=0)["kv_cache_usage"] == 0.9  # a caller that must be fresh
    now[0] = 1.0
    m["kv"].set(0.1)
    assert reader.read()["kv_cache_usage"] == 0.1


def test_no_lora_info_means_no_running_adapters():
    reg, _ = vllm_registry()
    assert read_engine_counters(reg)["lora_running_adapters"] == 0


def test_adapter_loads_evictions_and_the_ledger():
    sink = FakeSink()
    replica = ReplicaMetrics(sink, "engine", "qwen")
    replica.adapter_loaded(0.3)
    replica.adapters_evicted("lru", 2)
    replica.adapters_evicted("deleted")
    replica.adapters_evicted("lru", 0)
    replica.resident_adapters(5)
    replica.ledger(1_700_000_000.0, 12)
    assert sink[c.ADAPTER_LOADS.name].total() == 1 and sink[c.ADAPTER_LOAD_SECONDS.name].total() == 1
    assert sink[c.ADAPTER_EVICTIONS.name].total(reason="lru") == 2
    assert sink[c.ADAPTER_EVICTIONS.name].total(reason="deleted") == 1
    assert sink[c.LOADED_ADAPTERS.name].total(tier="cpu") == 5
    assert sink[c.SPOOL_LAST_FLUSH.name].total() == 1_700_000_000.0 and sink[c.SPOOL_PENDING.name].total() == 12


def test_the_publisher_publishes_at_once_then_every_period_and_survives_a_failing_source():
    calls = []

    def broken():
        raise RuntimeError("engine gone")

    publisher = Publisher(0.01, [broken, lambda: calls.append(1)]).start()
    try:
        import time
        deadline = time.monotonic() + 5
        while len(calls) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        publisher.stop()
    assert len(calls) >= 3


def test_an_engine_replica_labels_each_of_its_metrics_with_its_base_model():
    sink = FakeSink()
    replica = ReplicaMetrics(sink, "engine", "qwen")
    replica.engine_stats({"kv_cache_usage": 0.5, "preemptions": 1})
    replica.adapter_loaded(0.2)
    replica.fair_queue({"dispatch_limit": 4, "dispatched": 1, "tenants": {"ten_a": {"queued": 2, "counter": 7}}},
                       lambda tenant: tenant)
    replica.ledger(1.0, 0)
    for spec in c.ENGINE_METRICS:
        assert c.MODEL in spec.labels, spec.name
        assert sink[spec.name].label_values(c.MODEL) <= {"qwen"}, spec.name
    assert sink[c.KV_USAGE.name].total(model="qwen") == 0.5
    assert sink[c.FAIR_QUEUE_LENGTH.name].total(tenant="ten_a", model="qwen") == 2
    # The ledger's gauges are per replica, Engine or Ingress: no model.
    assert c.MODEL not in c.SPOOL_PENDING.labels and sink[c.SPOOL_PENDING.name].series() == {()}


def test_an_engine_replica_without_its_base_model_is_refused():
    import pytest

    with pytest.raises(ValueError, match="engine.model_id"):
        ReplicaMetrics(FakeSink(), "engine")


def test_unreachable_steps_per_class_are_exported_by_what_they_grew():
    sink = FakeSink()
    replica = ReplicaMetrics(sink, "engine", "qwen")
    assert sink[c.UNREACHABLE_STEPS.name].values == {}  # its classes are known only when counted
    replica.unreachable_steps({})
    replica.unreachable_steps({"interactive": 3})
    replica.unreachable_steps({"interactive": 5, "agent": 1})
    replica.unreachable_steps({"interactive": 5, "agent": 1})  # nothing grew: nothing added
    metric = sink[c.UNREACHABLE_STEPS.name]
    assert metric.total(slo_class="interactive") == 5 and metric.total(slo_class="agent") == 1
    assert metric.label_values(c.MODEL) == {"qwen"}
    replica.unreachable_steps({"interactive": 2})  # a new EngineCore counts from 0 again
    assert metric.total(slo_class="interactive") == 7
