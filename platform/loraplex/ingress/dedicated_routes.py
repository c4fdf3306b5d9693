"""/admin dedicated routes: mark a tenant's adapter version for a merged dedicated replica, unmark
it, and see every dedicated version with its path's state.

A mark is stored in the database and takes effect when the app is next built (`serve run`, a
restart, or a `serve deploy` that changes `args`): that build adds a Merged-<id> Engine deployment
serving the version merged into the base weights (Serve cannot add a deployment to a running app
without a build). Until then GET shows it under `pending`. An unmark takes effect at once on this
ingress replica and within `dedicated.health_poll_s` on the others (the version's calls take the
LoRA pool); its replica is dropped at the next build. Versions marked in serve_config.yaml are
unmarked there.
"""

from __future__ import annotations

import asyncio
import time

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from loraplex.dedicated.marks import DedicatedMarks
from loraplex.dedicated.path_choice import DedicatedPaths
from loraplex.ingress.auth import check_admin
from loraplex.ingress.errors import APIError
from loraplex.registry.store import AdapterNotFound

TAKES_EFFECT = ("at the app's next build: `serve run` / a restart, or `serve deploy` of a config whose args "
                "changed (docs/operations.md#merged-dedicated-replicas)")


class DedicatedRoutes:
    def __init__(self, tenancy, registry, paths: DedicatedPaths | None):
        self.tenancy = tenancy
        self.catalog = registry.catalog
        self.marks = DedicatedMarks(registry.catalog.engine)
        self.paths = paths if paths is not None else DedicatedPaths({})

    def routes(self) -> list[Route]:
        path = "/admin/tenants/{tenant_id}/adapters/{ref}/dedicated"
        return [
            Route(path, self.mark, methods=["PUT"]),
            Route(path, self.unmark, methods=["DELETE"]),
            Route("/admin/dedicated", self.show, methods=["GET"]),
        ]

    async def mark(self, request: Request) -> Response:
        check_admin(request, self.tenancy)
        version = await asyncio.to_thread(self._resolve, request)
        created = await asyncio.to_thread(self.marks.put, version)
        return JSONResponse(self._entry(version.id, version.tenant, version.name, version.version),
                            status_code=201 if created else 200)

    async def unmark(self, request: Request) -> Response:
        check_admin(request, self.tenancy)
        version = await asyncio.to_thread(self._resolve, request)
        target = self.paths.targets.get(version.id)
        if target is not None and target.source == "config":
            raise APIError(409, f"{target.label} is dedicated by serve_config.yaml (dedicated.adapters); remove it "
                                "there and `serve deploy` the config.")
        if not await asyncio.to_thread(self.marks.delete, version.id):
            raise APIError(404, f"{version.tenant}/{version.name}@{version.version} is not marked dedicated.")
        self.paths.unmark(version.id)  # this replica: at once; the others at their next poll
        return JSONResponse({**self._entry(version.id, version.tenant, version.name, version.version),
                             "marked": False})

    async def show(self, request: Request) -> Response:
        check_admin(request, self.tenancy)
        marked = await asyncio.to_thread(self.marks.live)
        now = time.monotonic()
        built = [{**t.to_response(), **self.paths.state(i, now)} for i, t in self.paths.targets.items()]
        pending = [{"adapter": f"{v.tenant}/{v.name}@{v.version}", "adapter_id": v.id, "sha256": v.sha256,
                    "takes_effect": TAKES_EFFECT} for v in marked if v.id not in self.paths.targets]
        return JSONResponse({"object": "list", "data": built, "pending": pending})

    def _resolve(self, request: Request):
        tenant, ref = request.path_params["tenant_id"], request.path_params["ref"]
        try:
            return self.catalog.resolve(tenant, ref)
        except AdapterNotFound as exc:
            raise APIError(404, f"The adapter `{tenant}/{ref}` does not exist (or was deleted).") from exc

    def _entry(self, adapter_id: int, tenant: str, name: str, version: int) -> dict:
        target = self.paths.targets.get(adapter_id)
        entry = {"adapter": f"{tenant}/{name}@{version}", "adapter_id": adapter_id, "marked": True,
                 "deployment": target.deployment_name if target is not None else None}
        if target is None:
            entry["takes_effect"] = TAKES_EFFECT
        else:
            entry.update(self.paths.state(adapter_id, time.monotonic()))
        return entry
