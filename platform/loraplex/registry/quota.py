"""AdapterQuota: how many adapter versions, and how many stored bytes, a tenant may hold.

From the tenant's limits (TenantLimits.max_adapter_versions / max_adapter_bytes: per plan, a
tenant's own value wins, as for every limit). Counted over the tenant's live versions (a version's
size_bytes: its canonical config + weights); checked when a version is added, in the catalog's
write transaction (AdapterCatalog.add), and once before an upload is unpacked (cheap, so a tenant
at its count spends no CPU). An upload of weights the name already has live is no new version and
passes whatever the quota. On PostgreSQL two uploads committing at once on two replicas may each
see the other's row missing: the count can pass the quota by uploads_per_tenant x ingress replicas.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from loraplex.errors import StatusError

FIX = "delete versions you no longer serve (DELETE /v1/adapters/{name} or /v1/adapters/{name@version}; list them " \
      "with GET /v1/adapters), or ask your administrator for a larger quota"


class QuotaExceeded(StatusError):
    status = 409


@dataclass(frozen=True)
class AdapterQuota:
    max_versions: Optional[int] = None
    max_bytes: Optional[int] = None

    @classmethod
    def of(cls, limits) -> "AdapterQuota":
        """The quota of a TenantLimits (None when the limits set neither)."""
        return cls(getattr(limits, "max_adapter_versions", None), getattr(limits, "max_adapter_bytes", None))

    def check(self, versions: int, stored_bytes: int, new_bytes: int = 0, adding: bool = True) -> None:
        """QuotaExceeded unless `versions` live ones (`stored_bytes`) plus one of `new_bytes` fit."""
        if self.max_versions is not None and versions + (1 if adding else 0) > self.max_versions:
            raise QuotaExceeded(f"this tenant holds {versions} adapter versions, its quota "
                                f"(max_adapter_versions) is {self.max_versions}: {FIX}",
                                status=409, code="adapter_versions_quota", reject_reason="409:adapter_versions_quota")
        if self.max_bytes is not None and stored_bytes + new_bytes > self.max_bytes:
            raise QuotaExceeded(f"this tenant's adapter versions hold {stored_bytes} bytes and this one "
                                f"{new_bytes}; its quota (max_adapter_bytes) is {self.max_bytes} bytes: {FIX}",
                                status=413, code="adapter_bytes_quota", reject_reason="413:adapter_bytes_quota")
