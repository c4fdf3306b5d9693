"""MetricsConfig: the `metrics:` section of serve_config.yaml's args."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class MetricsConfig(BaseModel):
    """Per-tenant Prometheus metrics from every Engine and Ingress replica (docs/metrics.md)."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(
        True,
        description="Record the `loraplex_*` metrics. Off: every hook is a no-op and no publisher "
        "thread runs (scripts/bench_metrics.py measures the difference).",
    )
    max_tenant_labels: int = Field(
        100, ge=1,
        description="Tenants that keep their own `tenant` label value per replica: the busiest by "
        "tokens; the others are counted under `tenant=\"other\"`. Bounds every per-tenant metric "
        "at max_tenant_labels + 1 tenant values per replica (+1 for `-`, refusals without a key).",
    )
    max_adapter_labels: int = Field(
        100, ge=1,
        description="(tenant, adapter) pairs that keep their own `adapter` label value per replica, "
        "the busiest by tokens; the others are `adapter=\"other\"`. Base-model requests are `base`.",
    )
    label_window_s: float = Field(
        3600.0, gt=0,
        description="How often the busiest tenants and adapters are ranked again once the label "
        "slots are full. A tenant that loses its label keeps its old series (counters are "
        "cumulative) and counts under `other` from then on, so a longer window means fewer series.",
    )
    publish_period_s: float = Field(
        5.0, gt=0,
        description="How often a replica copies its gauges (KV-cache usage, queue, adapters, spool) and "
        "vLLM's counters into the exported metrics. Ray exports every metrics_report_interval_ms (10 s).",
    )
