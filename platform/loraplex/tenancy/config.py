"""TenancyConfig: the admin token, plans' default limits and how limits are enforced. Tenants and
keys live in PlatformConfig.database_url."""

from __future__ import annotations

import os
from typing import Optional

from pydantic import BaseModel, ConfigDict, Field

from loraplex.admission.config import LimiterConfig
from loraplex.tenancy.models import DEFAULT_PLAN, TenantLimits

ADMIN_TOKEN_ENV = "LORAPLEX_ADMIN_TOKEN"


class PlanConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    limits: TenantLimits = Field(
        default_factory=TenantLimits,
        description="Defaults for the plan's tenants; a limit a tenant sets itself wins.",
    )


class TenancyConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    admin_token: Optional[str] = Field(
        None,
        description=f"Bearer token for the /admin routes. Prefer the {ADMIN_TOKEN_ENV} env var, which wins "
        "over this field (a config file is easy to leak). With neither set, /admin answers 503.",
    )

    plans: dict[str, PlanConfig] = Field(
        default_factory=dict,
        description=f"Per plan name (as tenants have it): default limits. A tenant whose plan is not "
        f"listed gets the '{DEFAULT_PLAN}' plan's.",
    )
    limiter: LimiterConfig = Field(default_factory=LimiterConfig, description="How limits are enforced.")

    def plan_limits(self) -> dict[str, TenantLimits]:
        return {name: plan.limits for name, plan in self.plans.items()}

    def resolved_admin_token(self) -> Optional[str]:
        """The env var, else the config field; an empty string counts as unset (never open)."""
        return os.environ.get(ADMIN_TOKEN_ENV) or self.admin_token or None
