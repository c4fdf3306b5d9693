"""LimiterConfig: how tenant limits are enforced (`tenancy.limiter` in serve_config.yaml)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class LimiterConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    default_max_tokens: int = Field(
        512, gt=0,
        description="Completion tokens charged per sequence at admission for a chat request that sets no "
        "max_tokens while engine.max_model_len is null (the model's own length, which the ingress does not "
        "know). Otherwise such a request is charged what vLLM lets it generate: max_model_len minus the prompt "
        "estimate (a completion's default is 16). The difference to what it really produced is settled when "
        "it ends.",
    )
    shards: int = Field(1, gt=0, description="Limiter actors; tenants are spread over them by hash.")
    slice_fraction: float = Field(
        0.05, gt=0, le=1,
        description="An ingress replica leases this share of a limit at a time (at least what the "
        "request needs) and spends it locally: fewer round trips, but an idle slice held by one "
        "replica may make another refuse early, for at most lease_s.",
    )
    lease_s: float = Field(1.0, gt=0, description="Unused leased allowance goes back to the shared state after this long idle.")
    budget_cache_s: float = Field(
        5.0, gt=0, description="How long the limiter reuses a tenant's month-to-date ledger total.",
    )
    acquire_timeout_s: float = Field(
        1.0, gt=0, description="Longest an admission waits for the limiter actor before it fails open.",
    )
    startup_timeout_s: float = Field(
        30.0, gt=0, description="The same, for the first call of a replica (the actor may be starting).",
    )
    on_unavailable: Literal["open", "closed"] = Field(
        "open",
        description="When the limiter actor cannot be reached: 'open' admits (unlimited until it is "
        "back), 'closed' refuses limited tenants with 503 + Retry-After. The same when the actor cannot "
        "read a tenant's month-to-date usage (the database is down): 'open' enforces "
        "monthly_token_budget from the last read (none: not at all), 'closed' refuses that tenant's "
        "requests with 503 + Retry-After until a read succeeds. Either way "
        "loraplex_budget_source_failures_total counts the failed reads (alert LoraplexBudgetSourceFailing).",
    )
