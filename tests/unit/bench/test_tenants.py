"""bench/tenants.py, the one "create a tenant, then a key" of the benchmarks and end-to-end tests,
against the real ingress app: the tenant has the limits and plan asked for, the key works, and a
refusal raises with the server's answer (it names what is wrong)."""

import sys
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ingress"))
from live_server import serving  # noqa: E402
from platform_app import ADMIN_TOKEN, build_platform_app  # noqa: E402

from bench.tenants import new_tenant, new_tenant_key  # noqa: E402


@pytest.fixture
def url(tmp_path):
    platform = build_platform_app(tmp_path, lambda *a: iter(()))
    try:
        with serving(platform.app) as base_url:
            yield base_url
    finally:
        platform.close()


def test_a_tenant_with_its_limits_and_plan_and_a_working_key(url):
    tenant_id, key = new_tenant(url, ADMIN_TOKEN, "bench-a", {"priority": 7}, plan="default")
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    stored = httpx.get(f"{url}/admin/tenants/{tenant_id}", headers=admin).json()
    assert (stored["name"], stored["plan"], stored["limits"]["priority"]) == ("bench-a", "default", 7)
    assert httpx.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {key}"}).status_code == 200
    assert new_tenant_key(url, ADMIN_TOKEN, "bench-b").startswith("lpx-")


def test_a_refusal_raises_with_the_servers_answer(url):
    new_tenant_key(url, ADMIN_TOKEN, "bench-a")
    with pytest.raises(httpx.HTTPStatusError) as refused:
        new_tenant_key(url, ADMIN_TOKEN, "bench-a")
    assert "POST /admin/tenants: 409" in str(refused.value) and "bench-a" in str(refused.value)
