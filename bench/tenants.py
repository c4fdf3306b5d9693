"""An operator's first steps over the admin API, for benchmarks: a tenant, then a key for it."""

from __future__ import annotations

import httpx


def new_tenant_key(base_url: str, admin_token: str, name: str, limits: dict | None = None) -> str:
    """Create tenant `name` (with `limits`, if any) and return a new API key of it."""
    admin = {"Authorization": f"Bearer {admin_token}"}
    body = {"name": name, **({"limits": limits} if limits else {})}
    tenant = httpx.post(f"{base_url}/admin/tenants", json=body, headers=admin, timeout=30)
    tenant.raise_for_status()
    key = httpx.post(f"{base_url}/admin/tenants/{tenant.json()['id']}/keys", headers=admin, timeout=30)
    key.raise_for_status()
    return key.json()["key"]
