"""Tenancy: what the ingress needs for tenants (the service, its key cache, the admin token)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from sqlalchemy import Engine

from loraplex.tenancy.config import TenancyConfig
from loraplex.tenancy.key_cache import KeyCache
from loraplex.tenancy.service import TenantService


@dataclass
class Tenancy:
    """What the ingress needs for tenants, built once per ingress replica."""

    service: TenantService
    # None: the /admin routes answer 503 (never open by default). Not in repr(): a log line of the
    # Tenancy never shows it.
    admin_token: Optional[str] = field(repr=False)
    keys: Optional[KeyCache] = None  # verified keys (tenancy/key_cache.py); None: one with the defaults

    def __post_init__(self):
        if self.keys is None:
            self.keys = KeyCache(self.service)

    @classmethod
    def from_config(cls, cfg: TenancyConfig, engine: Engine, known_plans: Optional[set[str]] = None,
                    known_bases: Optional[list[str]] = None) -> Tenancy:
        """`engine`: make_engine(PlatformConfig.database_url), shared with registry and accounting;
        `known_plans`: the plan names tenants may be put on (None: any); `known_bases`: the base
        model names per-base limits may name (PlatformConfig.base_names; None: any)."""
        service = TenantService(engine, plans=cfg.plan_limits(), known_plans=known_plans, known_bases=known_bases)
        return cls(service=service, admin_token=cfg.resolved_admin_token(), keys=KeyCache(service, cfg.key_cache))
