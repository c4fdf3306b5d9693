"""SloConfig: the service-level objectives the alert rules and the dashboard are generated from
(`python -m loraplex.observability`; docs/observability.md). Replicas read only the TPOT target
(PlatformConfig.for_replicas), the ingress the TTFT/TPOT targets (GET /admin/latency)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


class SloConfig(BaseModel):
    """Targets and alert thresholds. The defaults suit the CPU profile (serve_config.yaml)."""

    model_config = ConfigDict(extra="forbid")

    ttft_p95_s: float = Field(
        2.5, gt=0, description="Time to first token, 95th percentile over all tenants, in seconds, above which "
        "LoraplexTTFTOverSLO fires.")
    tpot_p95_s: float = Field(
        0.3, gt=0, description="Time per output token (decode pace), 95th percentile, in seconds, above which "
        "LoraplexTPOTOverSLO fires.")
    availability: float = Field(
        0.99, gt=0, lt=1, description="Share of requests that must neither fail nor be shed (30-day objective), "
        "whose budget LoraplexErrorBudgetBurn watches.")
    error_rate: float = Field(
        0.05, gt=0, le=1, description="Share of engine requests ending in an error or timeout (over window_s) "
        "above which LoraplexErrorRateHigh fires.")
    shed_rate: float = Field(
        0.05, gt=0, le=1, description="Share of requests refused with 503 (load shedding, full queues) above "
        "which LoraplexShedRateHigh fires.")
    kv_usage_alert: float = Field(
        0.9, gt=0, le=1, description="KV-cache usage (0..1) of a replica above which LoraplexKVCacheNearlyFull "
        "fires.")
    spool_flush_max_age_s: int = Field(
        120, gt=0, description="A replica whose usage spool has not been copied into the database for this long "
        "fires LoraplexUsageSpoolNotFlushing.")
    window_s: int = Field(
        300, ge=60, description="Rate window of the latency, error and shed alerts, in seconds.")
    for_s: int = Field(
        300, ge=0, description="How long a condition must hold before its alert fires, in seconds.")

    @model_validator(mode="after")
    def _budget_burnable(self) -> "SloConfig":
        if (1 - self.availability) * 14.4 > 1:
            raise ValueError("availability below 0.9306: a 14.4x burn of its budget is over 100 % errors")
        return self
