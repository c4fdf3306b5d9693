"""Every /admin route the ingress mounts (found by walking the app, so a route added later is
covered too) refuses a tenant API key and a missing token with 401: the console's admin view
and the CLI reach nothing through a tenant key."""

from starlette.routing import Route
from starlette.testclient import TestClient

from platform_app import ADMIN_TOKEN, build_platform_app


def admin_routes(app) -> list[tuple[str, str]]:
    found = []
    for route in app.routes:
        if isinstance(route, Route) and route.path.startswith("/admin"):
            path = route.path.replace("{tenant_id}", "ten_0").replace("{key_id}", "key_0")
            found += [(method, path) for method in sorted(route.methods - {"HEAD"})]
    return found


def test_every_admin_route_refuses_a_tenant_key(tmp_path):
    platform = build_platform_app(tmp_path, lambda *a: iter(()))
    platform.add_tenant("acme")
    client = TestClient(platform.app, raise_server_exceptions=False)
    routes = admin_routes(platform.app)
    assert ("GET", "/admin/tenants") in routes and ("GET", "/admin/latency") in routes and len(routes) >= 12
    for method, path in routes:
        for headers in ({"Authorization": platform.keys["acme"]}, {}):
            r = client.request(method, path, headers=headers)
            assert r.status_code == 401, f"{method} {path} with {headers or 'no token'}: {r.status_code} {r.text}"
        admitted = client.request(method, path, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
        assert admitted.status_code != 401, f"{method} {path}: the admin token is refused"
    platform.close()
