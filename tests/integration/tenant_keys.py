"""Creating a tenant and its API key over the admin API, as an operator would."""

ADMIN_TOKEN = "integration-admin-token"  # the test deployments' tenancy.admin_token


def new_tenant_key(admin, name: str) -> str:
    tenant = admin.post("/admin/tenants", json={"name": name})
    assert tenant.status_code == 201, tenant.text
    key = admin.post(f"/admin/tenants/{tenant.json()['id']}/keys")
    assert key.status_code == 201, key.text
    return key.json()["key"]
