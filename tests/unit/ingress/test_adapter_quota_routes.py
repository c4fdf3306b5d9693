"""POST /v1/adapters under the tenant's quota (issue 34): max_adapter_versions from its plan, a
tenant's own value over it; past it 409 naming the quota, its value and the fix."""

from starlette.testclient import TestClient

from platform_app import build_platform_app


def script(method, call, request):
    yield {}


def upload(client, key, archive, name):
    return client.post("/v1/adapters", headers={"Authorization": key}, data={"name": name},
                       files={"file": ("a.tar.gz", archive)})


def test_the_plans_version_quota_holds_and_a_tenants_own_wins(tmp_path):
    platform = build_platform_app(tmp_path, script)
    from loraplex.tenancy.models import TenantLimits

    platform.service.plans["default"] = TenantLimits(max_adapter_versions=1)  # the plan's quota
    platform.add_tenant("acme")
    client = TestClient(platform.app, raise_server_exceptions=False)
    key = platform.keys["acme"]
    try:
        assert upload(client, key, platform.adapter_archive(r=4), "a").status_code == 201
        refused = upload(client, key, platform.adapter_archive(r=8), "b")
        assert refused.status_code == 409, refused.text
        message = refused.json()["error"]["message"]
        assert "max_adapter_versions" in message and "is 1" in message and "DELETE /v1/adapters" in message
        platform.service.update_tenant(platform.tenant_ids["acme"], limits={"max_adapter_versions": 2})
        platform.tenancy.keys.forget_tenant(platform.tenant_ids["acme"])
        assert upload(client, key, platform.adapter_archive(r=8), "b").status_code == 201
    finally:
        platform.close()
