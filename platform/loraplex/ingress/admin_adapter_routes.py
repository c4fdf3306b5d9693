"""/admin adapter routes: pin a tenant's adapter version on every replica, see what is pinned.

A pinned version is kept in the CPU tier (vLLM's host-memory LoRA cache) of every Engine replica
of its base's pool, so its LRU never evicts it and a request for it never waits for a load from
the store; replicas pick a pin up at their next catalog poll (`registry.deletion_poll_s`). At most
max_cpu_loras - 1 versions of a base are pinned at once (that base's engine settings), so one
place in its pool's tier stays for the rest.
"""

from __future__ import annotations

import asyncio

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from loraplex.engine.config import EngineConfig
from loraplex.ingress.auth import check_admin


def max_pinned(engine: EngineConfig) -> int:
    """Pins the CPU tier can take and still hold one unpinned adapter (vLLM's max_cpu_loras
    defaults to max_loras)."""
    return max((engine.max_cpu_loras or engine.max_loras) - 1, 0)


class AdminAdapterRoutes:
    def __init__(self, tenancy, registry, engines: dict[str, EngineConfig]):
        self.tenancy = tenancy
        self.catalog = registry.catalog
        self.engines = engines  # base name -> its engine settings, the first (default) base first
        self.engine = next(iter(engines.values()))

    def routes(self) -> list[Route]:
        return [
            Route("/admin/tenants/{tenant_id}/adapters/{ref}/pin", self.pin, methods=["POST"]),
            Route("/admin/tenants/{tenant_id}/adapters/{ref}/pin", self.unpin, methods=["DELETE"]),
            Route("/admin/adapters", self.show, methods=["GET"]),
        ]

    async def pin(self, request: Request) -> Response:
        return await self._set(request, True)

    async def unpin(self, request: Request) -> Response:
        return await self._set(request, False)

    async def _set(self, request: Request, pinned: bool) -> Response:
        check_admin(request, self.tenancy)
        tenant, ref = request.path_params["tenant_id"], request.path_params["ref"]
        bounds = {base: max_pinned(engine) for base, engine in self.engines.items()}  # each pool its own tier
        version = await asyncio.to_thread(self.catalog.pin, tenant, ref, pinned, bounds)
        return JSONResponse({"tenant": tenant, **version.to_response()})

    async def show(self, request: Request) -> Response:
        """The pinned versions and the CPU tier's bounds (count and bytes) every replica applies."""
        check_admin(request, self.tenancy)
        pinned = await asyncio.to_thread(self.catalog.pinned)
        return JSONResponse({
            "pinned": [{"tenant": v.tenant, **v.to_response()} for v in pinned],
            "max_pinned": max_pinned(self.engine),
            "max_loras": self.engine.max_loras,
            "max_cpu_loras": self.engine.max_cpu_loras,
            "max_cpu_lora_bytes": self.engine.max_cpu_lora_bytes,
            # Several bases: each pool's own bounds (the fields above are the first base's).
            **({"bases": {base: {"max_pinned": max_pinned(e), "max_loras": e.max_loras, "max_cpu_loras": e.max_cpu_loras,
                                 "max_cpu_lora_bytes": e.max_cpu_lora_bytes} for base, e in self.engines.items()}}
               if len(self.engines) > 1 else {}),
        })
