"""Creating a tenant and its API key over the admin API, as an operator would."""

ADMIN_TOKEN = "integration-admin-token"  # the test deployments' tenancy.admin_token


def new_tenant_key(admin, name: str) -> str:
    return new_tenant(admin, name)[1]


def new_tenant(admin, name: str) -> tuple[str, str]:
    """(tenant id, API key) of a new tenant."""
    tenant = admin.post("/admin/tenants", json={"name": name})
    assert tenant.status_code == 201, tenant.text
    key = admin.post(f"/admin/tenants/{tenant.json()['id']}/keys")
    assert key.status_code == 201, key.text
    return tenant.json()["id"], key.json()["key"]
