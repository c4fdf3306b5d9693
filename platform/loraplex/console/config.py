"""ConsoleConfig: where the admin console's latency panel reads its figures."""

from __future__ import annotations

from typing import Optional

from pydantic import BaseModel, ConfigDict, Field


class ConsoleConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    prometheus_url: Optional[str] = Field(
        None, description="Base URL of a Prometheus HTTP API that scrapes this platform (e.g. "
        "http://127.0.0.1:9090 from scripts/prometheus). GET /admin/latency (the console's latency "
        "panel) then reads TTFT/TPOT P95 from the `loraplex_*` histograms; unset, or when it does not "
        "answer, it computes them from the usage ledger's timestamps.")
    prometheus_timeout_s: float = Field(
        5.0, gt=0, description="How long GET /admin/latency waits for Prometheus before it falls back "
        "to the ledger.")
