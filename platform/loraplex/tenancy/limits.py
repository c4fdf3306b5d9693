"""TenantLimits: the per-tenant limits of the REST contract, validated before they are stored."""

from __future__ import annotations

from typing import Optional

from pydantic import BaseModel, ConfigDict, Field


class TenantLimits(BaseModel):
    """A missing or null limit means unlimited; suspend the tenant to block it entirely."""

    # Unknown keys are refused: a typo like "request_per_minute" would otherwise be silently unlimited.
    model_config = ConfigDict(extra="forbid")

    requests_per_minute: Optional[int] = Field(None, ge=1, description="Requests admitted per rolling minute.")
    tokens_per_minute: Optional[int] = Field(
        None, ge=1, description="Prompt + completion tokens admitted per rolling minute."
    )
    max_concurrent_requests: Optional[int] = Field(None, ge=1, description="Requests in flight at once.")
    monthly_token_budget: Optional[int] = Field(
        None, ge=1, description="Prompt + completion tokens per calendar month (UTC)."
    )
    priority: int = Field(
        0, ge=0, le=100, description="Load-shedding priority: under overload lower priorities are shed first."
    )

    def merged(self, changes: dict) -> "TenantLimits":
        """PATCH semantics: keys present in `changes` replace (null clears a limit), others stay."""
        return TenantLimits.model_validate({**self.model_dump(), **changes})
