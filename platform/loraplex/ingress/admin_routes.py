"""/admin tenant and key routes, behind the admin bearer token.

The admin API is never open by default: with no admin token configured it answers 503.
"""

from __future__ import annotations

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from loraplex.ingress.auth import check_admin
from loraplex.ingress.openai_routes import parse, read_json
from loraplex.tenancy.models import TenantCreate, TenantUpdate
from loraplex.tenancy.tenancy import Tenancy

ADMIN_MAX_BODY_BYTES = 64 * 1024  # tenant bodies are a name and a few numbers


class AdminRoutes:
    def __init__(self, tenancy: Tenancy, replicas=None):
        self.tenancy = tenancy
        self.service = tenancy.service
        # async () -> [Engine.status() of each replica, with replica_id, running, waiting, kv_usage]
        self.replicas = replicas

    def routes(self) -> list[Route]:
        return [
            Route("/admin/tenants", self.create_tenant, methods=["POST"]),
            Route("/admin/tenants", self.list_tenants, methods=["GET"]),
            Route("/admin/tenants/{tenant_id}", self.get_tenant, methods=["GET"]),
            Route("/admin/tenants/{tenant_id}", self.update_tenant, methods=["PATCH"]),
            Route("/admin/tenants/{tenant_id}/keys", self.issue_key, methods=["POST"]),
            Route("/admin/tenants/{tenant_id}/keys", self.list_keys, methods=["GET"]),
            Route("/admin/keys/{key_id}", self.revoke_key, methods=["DELETE"]),
            Route("/admin/replicas", self.list_replicas, methods=["GET"]),
        ]

    async def list_replicas(self, request: Request) -> Response:
        self.check_admin(request)
        data = await self.replicas() if self.replicas is not None else []
        return JSONResponse({"object": "list", "data": data})

    async def create_tenant(self, request: Request) -> Response:
        self.check_admin(request)
        body = parse(TenantCreate, await read_json(request, ADMIN_MAX_BODY_BYTES))
        tenant = await run_in_threadpool(self.service.create_tenant, body.name, body.plan, body.limits)
        return JSONResponse(self.tenant_json(tenant), status_code=201)

    async def list_tenants(self, request: Request) -> Response:
        self.check_admin(request)
        tenants = await run_in_threadpool(self.service.list_tenants)
        return JSONResponse({"object": "list", "data": [self.tenant_json(t) for t in tenants]})

    async def get_tenant(self, request: Request) -> Response:
        self.check_admin(request)
        tenant = await run_in_threadpool(self.service.get_tenant, request.path_params["tenant_id"])
        return JSONResponse(self.tenant_json(tenant))

    async def update_tenant(self, request: Request) -> Response:
        self.check_admin(request)
        body = parse(TenantUpdate, await read_json(request, ADMIN_MAX_BODY_BYTES))
        tenant = await run_in_threadpool(self.service.update_tenant, request.path_params["tenant_id"],
                                    plan=body.plan, limits=body.limits, status=body.status)
        self.tenancy.keys.forget_tenant(tenant.id)  # here at once; other replicas within refresh_s
        return JSONResponse(self.tenant_json(tenant))

    async def issue_key(self, request: Request) -> Response:
        self.check_admin(request)
        record, key = await run_in_threadpool(self.service.issue_key, request.path_params["tenant_id"])
        # The only time the key is ever shown: only its sha256 is stored.
        return JSONResponse({**record.to_json(), "key": key}, status_code=201, headers={"Cache-Control": "no-store"})

    async def list_keys(self, request: Request) -> Response:
        self.check_admin(request)
        keys = await run_in_threadpool(self.service.list_keys, request.path_params["tenant_id"])
        return JSONResponse({"object": "list", "data": [k.to_json() for k in keys]})

    async def revoke_key(self, request: Request) -> Response:
        self.check_admin(request)
        record = await run_in_threadpool(self.service.revoke_key, request.path_params["key_id"])
        self.tenancy.keys.forget_key(record.id)  # here at once; other replicas within refresh_s
        return JSONResponse(record.to_json())

    def tenant_json(self, tenant) -> dict:
        """The tenant as stored (`limits`: its own values) and `effective_limits`: those over its
        plan's defaults, what admission enforces."""
        return {**tenant.to_json(),
                "effective_limits": self.service.effective_limits(tenant.plan, tenant.limits).model_dump()}

    def check_admin(self, request: Request) -> None:
        check_admin(request, self.tenancy)
