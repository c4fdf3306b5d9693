"""An operator's first steps over the admin API, for benchmarks and the end-to-end tests: a
tenant, then a key for it."""

from __future__ import annotations

import httpx


def new_tenant(base_url: str, admin_token: str, name: str, limits: dict | None = None,
               plan: str | None = None) -> tuple[str, str]:
    """Create tenant `name` (with `limits` and `plan`, if any); (its id, a new API key of it)."""
    admin = {"Authorization": f"Bearer {admin_token}"}
    body = {"name": name, **({"limits": limits} if limits else {}), **({"plan": plan} if plan else {})}
    tenant = _created(httpx.post(f"{base_url}/admin/tenants", json=body, headers=admin, timeout=30))
    key = _created(httpx.post(f"{base_url}/admin/tenants/{tenant['id']}/keys", headers=admin, timeout=30))
    return tenant["id"], key["key"]


def new_tenant_key(base_url: str, admin_token: str, name: str, limits: dict | None = None,
                   plan: str | None = None) -> str:
    """Create tenant `name` (with `limits` and `plan`, if any) and return a new API key of it."""
    return new_tenant(base_url, admin_token, name, limits, plan)[1]


def _created(response: httpx.Response) -> dict:
    """The body of a 201; anything else raises with the server's answer (it names what is wrong)."""
    if response.status_code != 201:
        request = response.request
        raise httpx.HTTPStatusError(f"{request.method} {request.url.path}: {response.status_code} {response.text}",
                                    request=request, response=response)
    return response.json()
