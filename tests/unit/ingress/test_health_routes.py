"""GET /readyz is unauthenticated (issue 34): it runs the generation at most once per cache_s
however often it is called, its body is the status alone (never an error's repr, hosts or
ports), and the details are at GET /admin/readyz behind the admin token."""

import asyncio

from starlette.applications import Starlette
from starlette.testclient import TestClient

from loraplex.errors import StatusError
from loraplex.ingress.errors import error_response
from loraplex.ingress.health_routes import HealthRoutes

SECRET_HOST = "10.1.2.3:6379"


class CountingEngine:
    def __init__(self, fail: bool = False):
        self.calls, self.fail = 0, fail

    async def ready(self):
        self.calls += 1
        await asyncio.sleep(0.01)
        if self.fail:
            raise ConnectionError(f"Ray GCS at {SECRET_HOST} unreachable")
        return {"replica_id": "engine-7", "probe_seconds": 0.01}


def build(engine, cache_s=3.0, clock=None, admin=True, replicas=(1, 1, "HEALTHY")):
    def check_admin(request):
        if request.headers.get("authorization") != "Bearer adm":
            raise StatusError("admin only", status=401)

    async def healthy():
        return replicas

    kwargs = {"clock": clock} if clock else {}
    routes = HealthRoutes(engine, healthy, cache_s=cache_s, check_admin=check_admin if admin else None, **kwargs)
    app = Starlette(routes=routes.routes(),
                    exception_handlers={StatusError: lambda request, exc: error_response(exc)})
    return routes, TestClient(app, raise_server_exceptions=False)


def test_hammering_readyz_runs_one_generation_per_cache_period():
    now = [1000.0]
    engine = CountingEngine()
    _, client = build(engine, cache_s=3.0, clock=lambda: now[0])
    for _ in range(50):
        assert client.get("/readyz").status_code == 200
    assert engine.calls == 1
    now[0] += 3.5  # the cached answer has aged out: the next call probes again
    assert client.get("/readyz").status_code == 200
    assert engine.calls == 2


def test_concurrent_callers_share_one_probe():
    engine = CountingEngine()
    routes, _ = build(engine)

    async def many():
        return await asyncio.gather(*(routes.report() for _ in range(20)))

    results = asyncio.run(many())
    assert engine.calls == 1 and all(code == 200 for code, _, _ in results)


def test_cache_s_zero_probes_every_call():
    engine = CountingEngine()
    _, client = build(engine, cache_s=0)
    for _ in range(3):
        client.get("/readyz")
    assert engine.calls == 3


def test_the_public_body_is_the_status_alone_and_the_details_need_the_admin_token():
    _, client = build(CountingEngine(fail=True))
    public = client.get("/readyz")
    assert public.status_code == 503 and public.headers["retry-after"]
    assert public.json() == {"status": "unready"}
    assert SECRET_HOST not in public.text and "ConnectionError" not in public.text
    assert client.get("/admin/readyz").status_code == 401
    details = client.get("/admin/readyz", headers={"Authorization": "Bearer adm"})
    assert details.status_code == 503 and SECRET_HOST in details.json()["reasons"][0]


def test_ready_details_for_the_admin():
    _, client = build(CountingEngine())
    assert client.get("/readyz").json() == {"status": "ready"}
    body = client.get("/admin/readyz", headers={"Authorization": "Bearer adm"}).json()
    assert body["status"] == "ready" and body["probe"]["replica_id"] == "engine-7"
    assert body["healthy_replicas"] == body["replicas"] == 1


def test_no_admin_api_no_details_route():
    _, client = build(CountingEngine(), admin=False)
    assert client.get("/admin/readyz").status_code == 404


def test_while_the_engine_starts_readyz_answers_503_at_once_without_a_generation():
    # Issue 46: no engine replica running yet, so a generation could only wait out its timeout
    # (30 s); the controller's counts answer at once.
    engine = CountingEngine()
    _, client = build(engine, replicas=(0, 1, "UPDATING"))
    public = client.get("/readyz")
    assert public.status_code == 503 and public.headers["retry-after"]
    assert public.json() == {"status": "unready"}
    assert engine.calls == 0
    details = client.get("/admin/readyz", headers={"Authorization": "Bearer adm"}).json()
    assert details["replicas"] == 1 and "starting" in details["reasons"][0]
