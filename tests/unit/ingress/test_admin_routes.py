import pytest
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from fake_engine import FakeEngineClient
from loraplex.config import PlatformConfig
from loraplex.db.engine import make_engine
from loraplex.ingress.app import build_ingress_app
from loraplex.ingress.auth import authenticate
from loraplex.tenancy.service import TenantService
from loraplex.tenancy.tenancy import Tenancy

ADMIN = "admin-secret-token"
AUTH = {"Authorization": f"Bearer {ADMIN}"}


def build(tenancy: Tenancy):
    engine = FakeEngineClient(lambda method, request, *context: iter(()), calls={"base_models": {"object": "list", "data": []}})
    app = build_ingress_app(engine, PlatformConfig.from_args(None), tenancy=tenancy)

    async def whoami(request: Request):
        # What a /v1 route does first.
        principal = await authenticate(request, tenancy)
        return JSONResponse({"tenant_id": principal.tenant_id, "key_id": principal.key_id})

    app.router.routes.append(Route("/v1/whoami", whoami))
    return TestClient(app, raise_server_exceptions=False)


@pytest.fixture
def service(tmp_path):
    engine = make_engine(f"sqlite:///{tmp_path}/admin.db")
    yield TenantService(engine)
    engine.dispose()


@pytest.fixture
def client(service):
    return build(Tenancy(service, admin_token=ADMIN))


def error_of(response, status):
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == status and error["message"] and error["type"]
    return error


def bearer(key):
    return {"Authorization": f"Bearer {key}"}


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": ADMIN},
                                     {"Authorization": f"Basic {ADMIN}"}, {"Authorization": f"Bearer {ADMIN}x"}])
def test_admin_routes_refuse_missing_or_wrong_token(client, headers):
    for method, path in [("GET", "/admin/tenants"), ("POST", "/admin/tenants"), ("GET", "/admin/tenants/ten_x"),
                         ("PATCH", "/admin/tenants/ten_x"), ("POST", "/admin/tenants/ten_x/keys"),
                         ("GET", "/admin/tenants/ten_x/keys"), ("DELETE", "/admin/keys/key_x")]:
        response = client.request(method, path, headers=headers, json={"name": "acme"})
        error = error_of(response, 401)
        assert error["type"] == "authentication_error" and "admin token" in error["message"]
        assert response.headers["www-authenticate"] == "Bearer"
    assert client.get("/admin/tenants", headers=AUTH).json()["data"] == []  # nothing was created


def test_tenant_key_is_not_an_admin_token(client, service):
    _, key = service.issue_key(service.create_tenant("acme").id)
    error_of(client.get("/admin/tenants", headers=bearer(key)), 401)


@pytest.mark.parametrize("token", [None, ""])
def test_no_admin_token_configured_is_503_with_the_fix(service, token):
    client = build(Tenancy(service, admin_token=token))
    for headers in ({}, AUTH, {"Authorization": "Bearer "}):
        error = error_of(client.get("/admin/tenants", headers=headers), 503)
        assert "LORAPLEX_ADMIN_TOKEN" in error["message"]


def test_without_tenancy_there_are_no_admin_routes():
    engine = FakeEngineClient(lambda m, r, *c: iter(()))
    client = TestClient(build_ingress_app(engine, PlatformConfig.from_args(None)), raise_server_exceptions=False)
    error_of(client.get("/admin/tenants", headers=AUTH), 404)


def test_tenant_and_key_lifecycle(client):
    limits = {"requests_per_minute": 60, "priority": 1}
    created = client.post("/admin/tenants", headers=AUTH, json={"name": "acme", "plan": "pro", "limits": limits})
    assert created.status_code == 201, created.text
    tenant = created.json()
    assert tenant["id"].startswith("ten_") and tenant["name"] == "acme" and tenant["plan"] == "pro"
    assert tenant["status"] == "active" and tenant["limits"]["requests_per_minute"] == 60
    assert tenant["limits"]["tokens_per_minute"] is None
    tid = tenant["id"]

    assert client.get(f"/admin/tenants/{tid}", headers=AUTH).json() == tenant
    assert [t["id"] for t in client.get("/admin/tenants", headers=AUTH).json()["data"]] == [tid]

    issued = client.post(f"/admin/tenants/{tid}/keys", headers=AUTH)
    assert issued.status_code == 201 and issued.headers["cache-control"] == "no-store"
    key = issued.json()
    assert {"id", "key", "prefix", "tenant_id", "created_at"} <= set(key) and key["tenant_id"] == tid
    assert key["key"].startswith(key["prefix"])

    listed = client.get(f"/admin/tenants/{tid}/keys", headers=AUTH)
    assert listed.status_code == 200
    assert [k["id"] for k in listed.json()["data"]] == [key["id"]]
    assert key["key"] not in listed.text and "key" not in listed.json()["data"][0]

    assert client.get("/v1/whoami", headers=bearer(key["key"])).json() == {"tenant_id": tid, "key_id": key["id"]}

    patched = client.patch(f"/admin/tenants/{tid}", headers=AUTH, json={"plan": "team", "limits": {"priority": 3}})
    assert patched.status_code == 200
    assert patched.json()["plan"] == "team" and patched.json()["limits"]["priority"] == 3
    assert patched.json()["limits"]["requests_per_minute"] == 60

    # Suspension: 403 from the very next request; reactivation restores access.
    assert client.patch(f"/admin/tenants/{tid}", headers=AUTH, json={"status": "suspended"}).json()["status"] == "suspended"
    error = error_of(client.get("/v1/whoami", headers=bearer(key["key"])), 403)
    assert error["type"] == "permission_error" and "suspended" in error["message"]
    client.patch(f"/admin/tenants/{tid}", headers=AUTH, json={"status": "active"})
    assert client.get("/v1/whoami", headers=bearer(key["key"])).status_code == 200

    # Revocation: 401 from the very next request.
    revoked = client.delete(f"/admin/keys/{key['id']}", headers=AUTH)
    assert revoked.status_code == 200 and revoked.json()["revoked"] is True and revoked.json()["revoked_at"]
    response = client.get("/v1/whoami", headers=bearer(key["key"]))
    assert "revoked" in error_of(response, 401)["message"] and response.headers["www-authenticate"] == "Bearer"
    assert client.delete(f"/admin/keys/{key['id']}", headers=AUTH).json() == revoked.json()  # idempotent


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer lpx-nope"}, {"Authorization": "Bearer"},
                                     {"Authorization": "Basic abc"}])
def test_v1_auth_without_a_valid_key_is_401(client, headers):
    response = client.get("/v1/whoami", headers=headers)
    error_of(response, 401)
    assert response.headers["www-authenticate"] == "Bearer"


def test_duplicate_name_is_409(client):
    assert client.post("/admin/tenants", headers=AUTH, json={"name": "acme"}).status_code == 201
    error = error_of(client.post("/admin/tenants", headers=AUTH, json={"name": "acme"}), 409)
    assert "acme" in error["message"]


def test_unknown_tenant_or_key_is_404(client):
    error_of(client.get("/admin/tenants/ten_missing", headers=AUTH), 404)
    error_of(client.patch("/admin/tenants/ten_missing", headers=AUTH, json={"plan": "x"}), 404)
    error_of(client.post("/admin/tenants/ten_missing/keys", headers=AUTH), 404)
    error_of(client.get("/admin/tenants/ten_missing/keys", headers=AUTH), 404)
    error_of(client.delete("/admin/keys/key_missing", headers=AUTH), 404)


@pytest.mark.parametrize("body, param", [
    (b"{not json", None),
    (b"[1, 2]", None),
    (b'{"plan": "pro"}', "name"),
    (b'{"name": "Bad Name"}', "name"),
    (b'{"name": "acme", "limits": {"requests_per_minute": -1}}', "limits.requests_per_minute"),
    (b'{"name": "acme", "limits": {"rpm": 5}}', "limits.rpm"),
    (b'{"name": "acme", "colour": "red"}', "colour"),
])
def test_bad_create_bodies_are_400(client, body, param):
    error = error_of(client.post("/admin/tenants", headers={**AUTH, "Content-Type": "application/json"},
                                 content=body), 400)
    assert error["param"] == param
    assert client.get("/admin/tenants", headers=AUTH).json()["data"] == []


def test_bad_patch_bodies_are_400(client):
    tid = client.post("/admin/tenants", headers=AUTH, json={"name": "acme"}).json()["id"]
    error_of(client.patch(f"/admin/tenants/{tid}", headers=AUTH, json={"status": "deleted"}), 400)
    error = error_of(client.patch(f"/admin/tenants/{tid}", headers=AUTH, json={"limits": {"priority": -1}}), 400)
    assert "limits.priority" in error["message"]
    error_of(client.patch(f"/admin/tenants/{tid}", headers=AUTH, json={"limits": 5}), 400)
    # The server keeps serving after the errors.
    assert client.get(f"/admin/tenants/{tid}", headers=AUTH).json()["status"] == "active"


def test_a_tenant_shows_its_own_limits_and_the_effective_ones_over_its_plan(tmp_path):
    from loraplex.tenancy.models import TenantLimits

    engine = make_engine(f"sqlite:///{tmp_path}/plans.db")
    plans = {"pro": TenantLimits(requests_per_minute=600, max_concurrent_requests=8)}
    client = build(Tenancy(TenantService(engine, plans=plans), admin_token=ADMIN))
    created = client.post("/admin/tenants", headers=AUTH, json={"name": "acme", "plan": "pro",
                                                                "limits": {"max_concurrent_requests": 2}})
    assert created.status_code == 201, created.text
    tenant = client.get(f"/admin/tenants/{created.json()['id']}", headers=AUTH).json()
    assert tenant["limits"]["requests_per_minute"] is None  # stored: only what was set
    assert tenant["effective_limits"]["requests_per_minute"] == 600  # enforced: the plan's
    assert tenant["effective_limits"]["max_concurrent_requests"] == 2  # its own wins
    listed = client.get("/admin/tenants", headers=AUTH).json()["data"]
    assert listed[0]["effective_limits"] == tenant["effective_limits"]
    engine.dispose()


def test_a_plan_with_neither_limits_nor_prices_is_refused_with_the_configured_ones(tmp_path):
    # A typo ("por") would be stored and silently give the default plan's limits and prices.
    config = PlatformConfig.from_args({"tenancy": {"admin_token": ADMIN, "plans": {"pro": {"limits": {"requests_per_minute": 600}}}}})
    engine = make_engine(f"sqlite:///{tmp_path}/plans.db")
    client = build(Tenancy.from_config(config.tenancy, engine, known_plans=config.plan_names()))
    error = error_of(client.post("/admin/tenants", headers=AUTH, json={"name": "acme", "plan": "por"}), 400)
    assert "unknown plan 'por'; configured: default, pro" in error["message"]
    created = client.post("/admin/tenants", headers=AUTH, json={"name": "acme", "plan": "pro"})
    assert created.status_code == 201, created.text
    tenant = created.json()["id"]
    error_of(client.patch(f"/admin/tenants/{tenant}", headers=AUTH, json={"plan": "por"}), 400)
    assert client.patch(f"/admin/tenants/{tenant}", headers=AUTH, json={"plan": "default"}).status_code == 200
    engine.dispose()


def test_admin_replicas_lists_each_engine_replica_behind_the_admin_token(service, monkeypatch):
    from loraplex.routing import served_keys

    status = {"replica_id": "r1", "running": 2, "waiting": 0, "queued": 3, "kv_usage": 0.1, "in_flight": 2,
              "dispatch_limit": 2, "dispatched": 2, "tenants": {"ten_a": {"queued": 3, "running": 2, "counter": 9.0}},
              "loaded_adapters": [], "reported_at": 1.0}
    engine = FakeEngineClient(lambda *a: iter(()), calls={"replica_status": status})
    app = build_ingress_app(engine, PlatformConfig.from_args(None), tenancy=Tenancy(service, admin_token=ADMIN))
    client = TestClient(app, raise_server_exceptions=False)
    assert client.get("/admin/replicas").status_code == 401
    # Before this ingress has routed anything: the one replica a call reaches, asked now.
    monkeypatch.setattr(served_keys, "_LAST_STATUS", {})
    assert client.get("/admin/replicas", headers=AUTH).json() == {"object": "list", "data": [status]}
    # Then: every replica as its routing stats last reported it, but the one a call reaches as
    # it is now (r1's last report still had nothing queued).
    monkeypatch.setattr(served_keys, "_LAST_STATUS", {"r2": {**status, "replica_id": "r2"},
                                                      "r1": {**status, "queued": 0, "reported_at": 0.5}})
    data = client.get("/admin/replicas", headers=AUTH).json()["data"]
    assert [(r["replica_id"], r["queued"], r["reported_at"]) for r in data] == [("r1", 3, 1.0), ("r2", 3, 1.0)]
