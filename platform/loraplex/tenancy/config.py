"""TenancyConfig: the admin token. Tenants and keys live in PlatformConfig.database_url."""

from __future__ import annotations

import os
from typing import Optional

from pydantic import BaseModel, ConfigDict, Field

ADMIN_TOKEN_ENV = "LORAPLEX_ADMIN_TOKEN"


class TenancyConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    admin_token: Optional[str] = Field(
        None,
        description=f"Bearer token for the /admin routes. Prefer the {ADMIN_TOKEN_ENV} env var, which wins "
        "over this field (a config file is easy to leak). With neither set, /admin answers 503.",
    )

    def resolved_admin_token(self) -> Optional[str]:
        """The env var, else the config field; an empty string counts as unset (never open)."""
        return os.environ.get(ADMIN_TOKEN_ENV) or self.admin_token or None
