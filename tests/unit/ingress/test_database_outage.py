"""The database goes away: every route that needs it answers 503 + Retry-After with an OpenAI
error body saying the store is unavailable (never a 500), keys this replica verified keep
being served, an unknown key is 503 (not 401), an upload leaves nothing half-written, the
adapters a tenant used stay resolvable, and /readyz says `degraded`. The real ingress app,
tenancy, registry and accounting on SQLite; only the engine is a fake. The outage: every new
connection fails with OperationalError (tests/db_outage.py)."""

import io

import pytest
from starlette.testclient import TestClient

from db_outage import outage
from platform_app import ADMIN_TOKEN, BASE, build_platform_app

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def script(method, call, request):
    yield {"id": call.request_id, "object": "chat.completion", "model": request.model,
           "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
           "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}


@pytest.fixture
def env(tmp_path):
    platform = build_platform_app(tmp_path, script, calls={"ready": {"tokens": 1}})
    client = TestClient(platform.app, raise_server_exceptions=False)
    platform.add_tenant("acme")
    yield platform, client
    platform.close()


def chat(client, key, model=BASE):
    return client.post("/v1/chat/completions", headers={"Authorization": key},
                       json={"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1})


def upload(client, key, archive, name="style"):
    return client.post("/v1/adapters", headers={"Authorization": key}, data={"name": name},
                       files={"file": ("a.tar.gz", io.BytesIO(archive), "application/gzip")})


def assert_store_unavailable(response, label):
    assert response.status_code == 503, f"{label}: {response.status_code} {response.text}"
    assert int(response.headers["Retry-After"]) > 0, label
    error = response.json()["error"]
    assert error["code"] == "store_unavailable" and error["type"] == "service_unavailable", label
    assert "database is unavailable" in error["message"], label


def test_verified_key_is_served_unknown_key_is_503(env):
    platform, client = env
    key = platform.keys["acme"]
    assert chat(client, key).status_code == 200  # verified: now in this replica's cache
    unknown = "Bearer lpx-" + "u" * 43
    with outage(platform.service.engine):
        assert platform.tenancy.keys.refresh() is False  # the refresher notices
        for _ in range(3):
            assert chat(client, key).status_code == 200
        assert_store_unavailable(chat(client, unknown), "unknown key")
        # Not ours at all: no database needed to say 401.
        assert chat(client, "Bearer sk-openai-key").status_code == 401
    served = [r for r in platform.engine.requests if r[0] == "generate"]
    assert len(served) == 4


# Every route that needs the database, as (label, method, path, kwargs, tenant key or admin).
def routes(platform):
    tenant = platform.tenant_ids["acme"]
    key = platform.key_ids["acme"]
    return [
        ("usage", "GET", "/v1/usage", {}, "tenant"),
        ("delete adapter", "DELETE", "/v1/adapters/style", {}, "tenant"),
        ("create tenant", "POST", "/admin/tenants", {"json": {"name": "new"}}, "admin"),
        ("list tenants", "GET", "/admin/tenants", {}, "admin"),
        ("get tenant", "GET", f"/admin/tenants/{tenant}", {}, "admin"),
        ("patch tenant", "PATCH", f"/admin/tenants/{tenant}", {"json": {"status": "suspended"}}, "admin"),
        ("issue key", "POST", f"/admin/tenants/{tenant}/keys", {}, "admin"),
        ("list keys", "GET", f"/admin/tenants/{tenant}/keys", {}, "admin"),
        ("revoke key", "DELETE", f"/admin/keys/{key}", {}, "admin"),
        ("admin usage", "GET", "/admin/usage", {}, "admin"),
        ("admin usage of a tenant", "GET", "/admin/usage", {"params": {"tenant": tenant}}, "admin"),
        ("billing export", "GET", "/admin/billing/export", {"params": {"period": "2026-11"}}, "admin"),
        ("statement", "GET", f"/admin/tenants/{tenant}/statement", {"params": {"period": "2026-11"}}, "admin"),
        ("cost model", "GET", "/admin/cost-model", {}, "admin"),
    ]


def test_every_route_that_needs_the_database_is_503(env):
    platform, client = env
    key = platform.keys["acme"]
    assert chat(client, key).status_code == 200
    with outage(platform.service.engine):
        for label, method, path, kwargs, who in routes(platform):
            headers = ADMIN if who == "admin" else {"Authorization": key}
            assert_store_unavailable(client.request(method, path, headers=headers, **kwargs), label)
        # Inference for the cached tenant is still up after all of them.
        assert chat(client, key).status_code == 200
    # Nothing changed while down: the PATCH and the revocation never happened.
    assert chat(client, key).status_code == 200


def test_upload_during_outage_leaves_nothing_half_written(env):
    platform, client = env
    key, tenant = platform.keys["acme"], platform.tenant_ids["acme"]
    archive = platform.adapter_archive()
    assert chat(client, key).status_code == 200
    store = platform.tmp / "store"

    def blob_files():
        return sorted(p.relative_to(store) for p in store.rglob("*") if p.is_file()) if store.exists() else []

    with outage(platform.service.engine):
        assert_store_unavailable(upload(client, key, archive), "upload")
    assert blob_files() == []  # no blob without its catalog row
    assert client.get("/v1/adapters", headers={"Authorization": key}).json()["data"] == []  # no row either
    # Back up: the same upload works, as version 1.
    created = upload(client, key, archive)
    assert created.status_code == 201 and created.json()["version"] == 1
    assert blob_files() and tenant in str(blob_files()[0])


def test_a_used_adapter_stays_resolvable_an_unseen_one_is_503(env):
    platform, client = env
    key = platform.keys["acme"]
    assert upload(client, key, platform.adapter_archive()).status_code == 201
    assert chat(client, key, "style").status_code == 200  # resolved once: remembered
    models = client.get("/v1/models", headers={"Authorization": key}).json()["data"]
    with outage(platform.service.engine):
        assert chat(client, key, "style").status_code == 200
        assert chat(client, key, BASE).status_code == 200  # the base model needs no catalog
        assert_store_unavailable(chat(client, key, "style@1"), "an adapter ref never resolved here")
        during = client.get("/v1/models", headers={"Authorization": key})
        assert during.status_code == 200 and during.json()["data"] == models  # the last known list
        assert client.get("/v1/adapters", headers={"Authorization": key}).status_code == 200
    generated = [r[1] for r in platform.engine.requests if r[0] == "generate"]
    assert generated[-2].adapter is not None and generated[-2].adapter.name == "style"


def test_models_without_a_last_known_list_is_503(env):
    platform, client = env
    key = platform.keys["acme"]
    assert chat(client, key).status_code == 200
    with outage(platform.service.engine):
        assert_store_unavailable(client.get("/v1/models", headers={"Authorization": key}), "/v1/models")


def test_a_refused_request_during_outage_is_counted_as_store_unavailable(env):
    platform, client = env
    with outage(platform.service.engine):
        chat(client, "Bearer lpx-" + "u" * 43)
    platform.accounting.ledger.flush()
    report = client.get("/admin/usage", headers=ADMIN).json()
    assert {"tenant": "-", "tenant_name": None, "reason": "503:store_unavailable", "count": 1} in report["rejections"]


def test_readyz_degraded_while_cached_tenants_are_served(env):
    platform, client = env
    assert client.get("/readyz").json()["status"] == "ready"
    assert chat(client, platform.keys["acme"]).status_code == 200
    with outage(platform.service.engine):
        platform.tenancy.keys.refresh()
        during = client.get("/readyz")
        assert during.status_code == 200 and during.json() == {"status": "degraded"}
        body = client.get("/admin/readyz", headers=ADMIN).json()  # the details: operators only
        assert body["status"] == "degraded" and body["database"] == "unreachable" and body["cached_keys"] == 1
        assert "database unreachable" in body["reasons"][0]
        assert client.get("/healthz").status_code == 200  # liveness is not readiness
    platform.tenancy.keys.clock = lambda: 10 ** 9  # the refresher's next period
    platform.tenancy.keys.refresh()
    after = client.get("/readyz")
    assert after.status_code == 200 and after.json()["status"] == "ready"


def test_readyz_503_when_the_database_is_down_and_no_key_is_cached(env):
    platform, client = env
    with outage(platform.service.engine):
        platform.tenancy.keys.refresh()  # nothing cached: a ping, which fails
        response = client.get("/readyz")
        details = client.get("/admin/readyz", headers=ADMIN)
    assert response.status_code == 503 and response.headers["Retry-After"]
    assert response.json() == {"status": "degraded"}
    assert details.status_code == 503 and details.json()["cached_keys"] == 0


def test_a_bug_in_a_query_is_still_a_500(env):
    """Only an unreachable database maps to 503: an IntegrityError or a bad query is a bug."""
    from sqlalchemy.exc import ProgrammingError

    platform, client = env

    def broken():
        raise ProgrammingError("SELECT nonsense", {}, Exception("syntax error"))

    platform.service.list_tenants = broken
    response = client.get("/admin/tenants", headers=ADMIN)
    assert response.status_code == 500 and "Retry-After" not in response.headers
