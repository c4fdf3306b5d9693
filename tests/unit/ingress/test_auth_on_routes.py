"""Suspension (403) and revocation (401) hold on the real tenant routes, from the very next
request: /v1/chat/completions, /v1/completions, /v1/models, /v1/adapters (list, show, upload,
delete) and /v1/usage. The real ingress app with real tenancy, registry and accounting (SQLite,
local store); only the engine is a fake, which must never see a refused request."""

import io

import pytest
from starlette.testclient import TestClient

from platform_app import ADMIN_TOKEN, BASE, build_platform_app

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def script(method, call, request):
    yield {"id": call.request_id, "object": "chat.completion", "model": request.model,
           "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
           "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}


@pytest.fixture
def env(tmp_path):
    platform = build_platform_app(tmp_path, script)
    client = TestClient(platform.app, raise_server_exceptions=False)
    archive = platform.adapter_archive()
    tenant = client.post("/admin/tenants", headers=ADMIN, json={"name": "acme"}).json()
    keys = [client.post(f"/admin/tenants/{tenant['id']}/keys", headers=ADMIN).json() for _ in range(2)]
    yield client, platform.engine, tenant["id"], keys, archive
    platform.close()


def calls(archive):
    """Every tenant route, as (label, method, path, request kwargs, status when allowed)."""
    chat = {"model": BASE, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    return [
        ("chat", "POST", "/v1/chat/completions", {"json": chat}, 200),
        ("completion", "POST", "/v1/completions", {"json": {"model": BASE, "prompt": "hi", "max_tokens": 1}}, 200),
        ("models", "GET", "/v1/models", {}, 200),
        ("upload", "POST", "/v1/adapters",
         {"data": {"name": "style"}, "files": {"file": ("a.tar.gz", io.BytesIO(archive), "application/gzip")}}, 201),
        ("list adapters", "GET", "/v1/adapters", {}, 200),
        ("show adapter", "GET", "/v1/adapters/style", {}, 200),
        ("usage", "GET", "/v1/usage", {}, 200),
        ("usage csv", "GET", "/v1/usage", {"params": {"format": "csv"}}, 200),
        ("delete adapter", "DELETE", "/v1/adapters/style", {}, 200),
    ]


def send(client, key, method, path, kwargs):
    kwargs = dict(kwargs)
    if "files" in kwargs:  # a fresh stream for each send
        name, f, ctype = kwargs["files"]["file"]
        f.seek(0)
        kwargs["files"] = {"file": (name, io.BytesIO(f.read()), ctype)}
    return client.request(method, path, headers={"Authorization": f"Bearer {key}"}, **kwargs)


def assert_refused(response, status, word, label):
    assert response.status_code == status, f"{label}: {response.status_code} {response.text}"
    error = response.json()["error"]
    assert error["code"] == status and word in error["message"], (label, error)
    if status == 401:
        assert response.headers["www-authenticate"] == "Bearer", label


def test_every_route_serves_an_active_tenant(env):
    client, engine, _, keys, archive = env
    for label, method, path, kwargs, ok in calls(archive):
        response = send(client, keys[0]["key"], method, path, kwargs)
        assert response.status_code == ok, f"{label}: {response.status_code} {response.text}"
    assert len([r for r in engine.requests if r[0] == "generate"]) == 2


def test_a_suspended_tenant_gets_403_on_every_route_until_reactivated(env):
    client, engine, tenant_id, keys, archive = env
    suspended = client.patch(f"/admin/tenants/{tenant_id}", headers=ADMIN, json={"status": "suspended"})
    assert suspended.status_code == 200 and suspended.json()["status"] == "suspended"
    for label, method, path, kwargs, _ in calls(archive):
        for key in keys:  # every key of the tenant
            response = send(client, key["key"], method, path, kwargs)
            assert_refused(response, 403, "suspended", label)
            assert response.json()["error"]["type"] == "permission_error", label
    assert not [r for r in engine.requests if r[0] == "generate"], "a suspended tenant's request reached the engine"
    # Nothing was uploaded while suspended.
    client.patch(f"/admin/tenants/{tenant_id}", headers=ADMIN, json={"status": "active"})
    assert send(client, keys[0]["key"], "GET", "/v1/adapters", {}).json()["data"] == []
    for label, method, path, kwargs, ok in calls(archive):
        response = send(client, keys[1]["key"], method, path, kwargs)
        assert response.status_code == ok, f"{label} after reactivation: {response.status_code} {response.text}"


def test_a_revoked_key_gets_401_on_every_route_while_the_tenants_other_key_works(env):
    client, engine, _, keys, archive = env
    revoked, other = keys
    assert send(client, revoked["key"], "GET", "/v1/usage", {}).status_code == 200  # valid until revoked
    assert client.delete(f"/admin/keys/{revoked['id']}", headers=ADMIN).json()["revoked"] is True
    for label, method, path, kwargs, _ in calls(archive):
        assert_refused(send(client, revoked["key"], method, path, kwargs), 401, "revoked", label)
    assert not [r for r in engine.requests if r[0] == "generate"], "a revoked key's request reached the engine"
    for label, method, path, kwargs, ok in calls(archive):
        response = send(client, other["key"], method, path, kwargs)
        assert response.status_code == ok, f"{label} with the other key: {response.status_code} {response.text}"
