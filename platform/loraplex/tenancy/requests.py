"""Request bodies of the admin tenant routes; the service validates its arguments with them too."""

from __future__ import annotations

from typing import Any, Literal, Optional

import re

from pydantic import BaseModel, ConfigDict, Field, field_validator

from loraplex.tenancy.limits import TenantLimits

# Names end up in URLs, logs, CSV exports and metric labels: keep them plain.
NAME_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,63}$"
DEFAULT_PLAN = "default"


class TenantCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(
        description="Unique tenant name: 1-64 of lowercase letters, digits, '.', '_', '-', "
        "starting with a letter or digit.",
    )
    plan: str = Field(DEFAULT_PLAN, min_length=1, max_length=64, description="Pricing plan name.")
    limits: TenantLimits = Field(default_factory=TenantLimits, description="Rate limits, budget, priority.")

    @field_validator("name")
    @classmethod
    def _plain_name(cls, name: str) -> str:
        if not re.fullmatch(NAME_PATTERN, name):
            raise ValueError(f"{name!r} is not a valid tenant name: use 1-64 lowercase letters, digits, "
                             "'.', '_' or '-', starting with a letter or digit (e.g. 'acme-prod')")
        return name


class TenantUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    plan: Optional[str] = Field(None, min_length=1, max_length=64, description="New pricing plan name.")
    limits: Optional[dict[str, Any]] = Field(
        None,
        description="Limits to change; keys left out keep their value, a null value clears that limit.",
    )
    status: Optional[Literal["active", "suspended"]] = Field(
        None, description="'suspended' refuses the tenant's keys with 403 from the next request on; "
        "'active' reactivates it.",
    )
