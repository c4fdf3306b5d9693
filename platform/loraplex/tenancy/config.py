"""TenancyConfig: the admin token, plans' default limits and how limits are enforced. Tenants and
keys live in PlatformConfig.database_url."""

from __future__ import annotations

import os
from typing import Optional

from pydantic import BaseModel, ConfigDict, Field, SecretStr

from loraplex.accounting.config import DEFAULT_PLAN
from loraplex.admission.config import LimiterConfig
from loraplex.tenancy.models import TenantLimits

ADMIN_TOKEN_ENV = "LORAPLEX_ADMIN_TOKEN"


class PlanConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    limits: TenantLimits = Field(
        default_factory=TenantLimits,
        description="Defaults for the plan's tenants; a limit a tenant sets itself wins.",
    )
    weight: float = Field(
        1.0, gt=0,
        description="The plan's share of an Engine replica in its fair queue: backlogged tenants are "
        "served tokens in proportion to their plans' weights (2 gets twice what 1 gets).",
    )


class KeyCacheConfig(BaseModel):
    """The ingress's cache of verified API keys (tenancy/key_cache.py)."""

    model_config = ConfigDict(extra="forbid")

    refresh_s: float = Field(
        5.0, gt=0,
        description="While the database is up, a cached key is used only if verified less than this long ago (a "
        "revocation, suspension or limit change reaches every ingress replica within it).",
    )
    stale_s: float = Field(
        10.0, ge=0,
        description="While the database is up but slow, a key verified less than refresh_s + stale_s ago is still "
        "served from the cache while the background refresh re-verifies it (the revocation bound is then "
        "refresh_s + stale_s); only an older key waits for the database on the request path. 0: never stale.",
    )
    resolve_wait_s: float = Field(
        0.1, gt=0,
        description="How long a request waits for the database to resolve an adapter `model` this replica "
        "resolved within ttl_s before it is served that last resolution instead (the query lands in the "
        "background, one per adapter at a time): a slow database adds at most this to a request.",
    )
    ttl_s: float = Field(
        900.0, gt=0,
        description="While the database cannot be reached, a key verified less than this long ago keeps working "
        "with its last known tenant and limits (a key unused this long is forgotten).",
    )
    max_entries: int = Field(
        100_000, gt=0, description="Keys cached per ingress replica at most; the least recently used is forgotten first.",
    )
    negative_s: float = Field(
        5.0, ge=0,
        description="How long a key the database did not know (or knows revoked) is refused with 401 from memory "
        "on this replica; 0: every unknown key is looked up.",
    )


class TenancyConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    admin_token: Optional[SecretStr] = Field(
        None,
        description=f"Bearer token of the /admin routes, kept out of repr() (the env var {ADMIN_TOKEN_ENV} "
        "wins; with neither set, /admin answers 503).",
    )

    plans: dict[str, PlanConfig] = Field(
        default_factory=dict,
        description=f"Per plan name (as tenants have it): default limits. A tenant whose plan is not "
        f"listed gets the '{DEFAULT_PLAN}' plan's.",
    )
    limiter: LimiterConfig = Field(default_factory=LimiterConfig, description="How limits are enforced.")
    key_cache: KeyCacheConfig = Field(
        default_factory=KeyCacheConfig,
        description="How long each ingress replica trusts a key it verified (revocation bound, outage grace).",
    )

    def plan_limits(self) -> dict[str, TenantLimits]:
        return {name: plan.limits for name, plan in self.plans.items()}

    def plan_weight(self, plan: str) -> float:
        """The plan's fair-queue weight; a plan not listed has the default plan's (else 1)."""
        chosen = self.plans.get(plan) or self.plans.get(DEFAULT_PLAN)
        return chosen.weight if chosen is not None else 1.0

    def resolved_admin_token(self) -> Optional[str]:
        """The env var, else the config field; an empty string counts as unset (never open)."""
        configured = self.admin_token.get_secret_value() if self.admin_token is not None else None
        return os.environ.get(ADMIN_TOKEN_ENV) or configured or None
