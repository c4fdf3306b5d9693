"""Principal: who a tenant request runs as, resolved from its bearer key on every request."""

from __future__ import annotations

from dataclasses import dataclass

from loraplex.tenancy.limits import TenantLimits


@dataclass(frozen=True)
class Principal:
    tenant_id: str
    tenant_name: str
    plan: str
    limits: TenantLimits
    key_id: str
