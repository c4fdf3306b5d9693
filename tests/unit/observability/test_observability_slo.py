"""The `slo:` section: parsed from the shipped configs, never handed to replicas, and every
field changes the generated rules (a field that changed nothing would be a lie)."""
from pathlib import Path

import pytest
from pydantic import ValidationError

from loraplex.config import PlatformConfig
from loraplex.observability.rules import render_rules
from loraplex.observability.served import ServedPlatform, load_served
from loraplex.observability.config import SloConfig

ROOT = Path(__file__).resolve().parents[3]


def test_cpu_profile_states_the_defaults_and_gpu_profile_is_stricter():
    cpu = load_served(ROOT / "serve_config.yaml")
    gpu = load_served(ROOT / "serve_config.gpu.yaml")
    assert cpu.application == gpu.application == "loraplex"
    # The CPU profile's top-level figures are the defaults; its classes are its own (test_slo_classes_config.py).
    assert cpu.config.slo.model_copy(update={"classes": {}, "default_class": None}) == SloConfig()
    assert gpu.config.slo.ttft_p95_s < cpu.config.slo.ttft_p95_s
    assert gpu.config.slo.tpot_p95_s < cpu.config.slo.tpot_p95_s
    assert gpu.config.slo.availability > cpu.config.slo.availability


def test_replicas_never_see_the_alerts_so_retuning_one_restarts_nothing():
    a = PlatformConfig.from_args({"slo": {"shed_rate": 0.01, "availability": 0.999},
                                  "engine_deployment": {"num_replicas": 3}})
    b = PlatformConfig.from_args({"slo": {"shed_rate": 0.1}, "engine_deployment": {"num_replicas": 1}})
    assert a.for_replicas() == b.for_replicas()
    assert a.for_replicas().engine_deployment.num_replicas == 1


def test_replicas_get_the_latency_targets_in_the_fair_queues_adaptive_limit():
    a = PlatformConfig.from_args({"slo": {"ttft_p95_s": 1.0, "tpot_p95_s": 0.2}}).for_replicas()
    assert a.engine_deployment.fair_queue.adaptive.tpot_s == 0.2
    own = PlatformConfig.from_args({"slo": {"tpot_p95_s": 0.2}, "engine_deployment": {
        "fair_queue": {"adaptive": {"tpot_s": 0.5}}}}).for_replicas()
    assert own.engine_deployment.fair_queue.adaptive.tpot_s == 0.5  # the queue's own target wins


def test_bad_targets_are_refused():
    for bad in ({"availability": 1.0}, {"availability": 0.9}, {"ttft_p95_s": 0}, {"kv_usage_alert": 1.5},
                {"window_s": 30}, {"unknown": 1}):
        with pytest.raises(ValidationError):
            SloConfig(**bad)


@pytest.mark.parametrize("field, value", [
    ("ttft_p95_s", 1.0), ("tpot_p95_s", 0.1), ("availability", 0.995), ("error_rate", 0.1), ("shed_rate", 0.1),
    ("kv_usage_alert", 0.8), ("spool_flush_max_age_s", 600), ("window_s", 600), ("for_s", 60),
    ("classes", {"interactive": {"ttft_p95_s": 1.0}, "batch": {}}),
])
def test_every_slo_field_changes_the_rules(field, value):
    assert field in SloConfig.model_fields
    base = PlatformConfig.from_args({})
    changed = PlatformConfig.from_args({"slo": {field: value}})
    assert getattr(changed.slo, field) != getattr(base.slo, field)
    assert render_rules(ServedPlatform("loraplex", changed)) != render_rules(ServedPlatform("loraplex", base))


def test_the_field_list_above_is_complete():
    tested = {"ttft_p95_s", "tpot_p95_s", "availability", "error_rate", "shed_rate", "kv_usage_alert",
              "spool_flush_max_age_s", "window_s", "for_s", "classes"}
    # default_class decides a tenant's class (the ingress), not a rule: test_slo_classes_config.py.
    assert set(SloConfig.model_fields) == tested | {"default_class"}
