"""SloConfig: the service-level objectives the alert rules and the dashboard are generated from
(`python -m loraplex.observability`; docs/observability.md). Replicas read only the TPOT target
(PlatformConfig.for_replicas), the ingress the TTFT/TPOT targets (GET /admin/latency).

SLO classes: each tenant's plan names the latency it bought (`classes`, the plan's or tenant's
`slo_class` limit); the ingress puts its class's targets on every EngineCall, and the engine keeps
them. Without `classes`, the top-level figures are the one class, `default_class`."""

from __future__ import annotations

from typing import Optional

from pydantic import BaseModel, ConfigDict, Field, model_validator

from loraplex.contract import SloTargets

ONE_CLASS = "standard"  # the class the top-level figures make when `classes` is empty


class SloClass(BaseModel):
    """One latency class a plan can buy."""

    model_config = ConfigDict(extra="forbid")

    ttft_p95_s: Optional[float] = Field(
        None, gt=0, description="Time to first token its requests are promised (95th percentile), in seconds; "
        "null: none (batch work).")
    tpot_p95_s: Optional[float] = Field(
        None, gt=0, description="Time per output token its requests are promised (95th percentile), in seconds: "
        "a shared engine step carrying its decodes is sized to the tightest of these; null: none.")
    availability: float = Field(
        0.99, gt=0, lt=1, description="Share of its requests within its targets that its alert keeps "
        "(LoraplexSloClassAttainment fires below it).")


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
    classes: dict[str, SloClass] = Field(
        default_factory=dict, description="Named latency classes (e.g. interactive, chat, agent, batch) that "
        "plans and tenants name by their `slo_class` limit; empty: one class, `default_class`, with the "
        "top-level ttft_p95_s, tpot_p95_s and availability.")
    default_class: Optional[str] = Field(
        None, description="The class of a tenant whose plan names none (one of `classes`); null: the first "
        f"listed, or '{ONE_CLASS}' without classes.")
    window_s: int = Field(
        300, ge=60, description="Rate window of the latency, error and shed alerts, in seconds.")
    for_s: int = Field(
        300, ge=0, description="How long a condition must hold before its alert fires, in seconds.")

    @model_validator(mode="after")
    def _budget_burnable(self) -> "SloConfig":
        if (1 - self.availability) * 14.4 > 1:
            raise ValueError("availability below 0.9306: a 14.4x burn of its budget is over 100 % errors")
        if self.default_class is not None and self.default_class not in self.resolved_classes():
            raise ValueError(f"slo.default_class {self.default_class!r} is not one of slo.classes "
                             f"({', '.join(self.resolved_classes())})")
        return self

    def resolved_classes(self) -> dict[str, SloClass]:
        """Every class by name: `classes`, or the top-level figures as the one class."""
        if self.classes:
            return dict(self.classes)
        return {self.default_class or ONE_CLASS: SloClass(
            ttft_p95_s=self.ttft_p95_s, tpot_p95_s=self.tpot_p95_s, availability=self.availability)}

    def default_name(self) -> str:
        return self.default_class or next(iter(self.resolved_classes()))

    def targets(self, name: Optional[str]) -> SloTargets:
        """The targets of class `name`; the default class's for None or a class no longer configured."""
        classes = self.resolved_classes()
        if name not in classes:
            name = self.default_name()
        c = classes[name]
        return SloTargets(name, c.ttft_p95_s, c.tpot_p95_s)
