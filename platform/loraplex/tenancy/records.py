"""What the tenant service returns: plain dataclasses with the JSON the admin API shows."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Optional

from loraplex.tenancy.limits import TenantLimits

STATUSES = ("active", "suspended")


@dataclass(frozen=True)
class Tenant:
    id: str
    name: str
    plan: str
    limits: TenantLimits
    status: str
    created_at: datetime
    updated_at: datetime

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id, "object": "tenant", "name": self.name, "plan": self.plan,
            "limits": self.limits.model_dump(), "status": self.status,
            "created_at": self.created_at.isoformat(), "updated_at": self.updated_at.isoformat(),
        }


@dataclass(frozen=True)
class ApiKey:
    """A key's record; the secret itself is never stored, only its sha256."""

    id: str
    tenant_id: str
    prefix: str
    created_at: datetime
    revoked_at: Optional[datetime] = None

    @property
    def revoked(self) -> bool:
        return self.revoked_at is not None

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id, "object": "api_key", "tenant_id": self.tenant_id, "prefix": self.prefix,
            "created_at": self.created_at.isoformat(), "revoked": self.revoked,
            "revoked_at": self.revoked_at.isoformat() if self.revoked_at else None,
        }
