"""Tenancy: what the ingress needs for tenants, built once per ingress replica."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from sqlalchemy import Engine

from loraplex.tenancy.config import TenancyConfig
from loraplex.tenancy.service import TenantService


@dataclass
class Tenancy:
    service: TenantService
    admin_token: Optional[str]  # None: the /admin routes answer 503 (never open by default)

    @classmethod
    def from_config(cls, cfg: TenancyConfig, engine: Engine) -> "Tenancy":
        """`engine`: make_engine(PlatformConfig.database_url), shared with registry and accounting."""
        return cls(service=TenantService(engine), admin_token=cfg.resolved_admin_token())
