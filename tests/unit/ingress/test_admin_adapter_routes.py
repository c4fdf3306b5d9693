"""/admin adapter pins: an operator pins a tenant's adapter version (every replica keeps it in
its CPU tier), sees the pins and the tier's bounds, unpins it; bad refs 404, too many pins 409."""

from __future__ import annotations

import pytest
from starlette.testclient import TestClient

from platform_app import ADMIN_TOKEN, build_platform_app

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def script(method, request, *context):
    yield {"object": "chat.completion", "choices": []}


@pytest.fixture
def platform(tmp_path):
    p = build_platform_app(tmp_path, script, engine={"max_loras": 2, "max_cpu_loras": 3, "max_cpu_lora_bytes": 5_000_000})
    for name in ("acme", "globex"):
        p.add_tenant(name)
    yield p
    p.close()


def upload(client, platform, tenant: str, name: str, r: int) -> dict:
    reply = client.post("/v1/adapters", headers={"Authorization": platform.keys[tenant]}, data={"name": name},
                        files={"file": ("a.tar.gz", platform.adapter_archive(r=r), "application/gzip")})
    assert reply.status_code == 201, reply.text
    return reply.json()


def test_pin_list_and_unpin(platform):
    client = TestClient(platform.app, raise_server_exceptions=False)
    acme = platform.tenant_ids["acme"]
    upload(client, platform, "acme", "bot", 4)
    pinned = client.post(f"/admin/tenants/{acme}/adapters/bot@1/pin", headers=ADMIN)
    assert pinned.status_code == 200, pinned.text
    assert (pinned.json()["tenant"], pinned.json()["name"], pinned.json()["pinned"]) == (acme, "bot", True)
    shown = client.get("/admin/adapters", headers=ADMIN).json()
    assert [(v["tenant"], v["name"], v["version"]) for v in shown["pinned"]] == [(acme, "bot", 1)]
    assert (shown["max_pinned"], shown["max_cpu_loras"], shown["max_cpu_lora_bytes"]) == (2, 3, 5_000_000)
    # The tenant sees it pinned in its own listing too.
    listed = client.get("/v1/adapters/bot", headers={"Authorization": platform.keys["acme"]}).json()
    assert listed["versions"][0]["pinned"] is True
    assert client.delete(f"/admin/tenants/{acme}/adapters/bot/pin", headers=ADMIN).json()["pinned"] is False
    assert client.get("/admin/adapters", headers=ADMIN).json()["pinned"] == []


def test_pins_need_the_admin_token_a_real_version_and_room(platform):
    client = TestClient(platform.app, raise_server_exceptions=False)
    acme, globex = platform.tenant_ids["acme"], platform.tenant_ids["globex"]
    for i, r in enumerate((4, 8, 2)):
        upload(client, platform, "acme", f"a{i}", r)
    assert client.post(f"/admin/tenants/{acme}/adapters/a0/pin").status_code == 401
    assert client.post(f"/admin/tenants/{acme}/adapters/a0/pin",
                       headers={"Authorization": platform.keys["acme"]}).status_code == 401
    missing = client.post(f"/admin/tenants/{globex}/adapters/a0/pin", headers=ADMIN)  # another tenant's
    assert missing.status_code == 404 and missing.json()["error"]["message"]
    for name in ("a0", "a1"):
        assert client.post(f"/admin/tenants/{acme}/adapters/{name}/pin", headers=ADMIN).status_code == 200
    full = client.post(f"/admin/tenants/{acme}/adapters/a2/pin", headers=ADMIN)
    assert full.status_code == 409 and "max_cpu_loras" in full.json()["error"]["message"]
    assert client.post(f"/admin/tenants/{acme}/adapters/a1/pin", headers=ADMIN).status_code == 200  # already: fine
    # A deleted version stops counting (and is no longer pinned anywhere).
    assert client.delete("/v1/adapters/a1", headers={"Authorization": platform.keys["acme"]}).status_code == 200
    assert client.post(f"/admin/tenants/{acme}/adapters/a2/pin", headers=ADMIN).status_code == 200
