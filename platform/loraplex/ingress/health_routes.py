"""GET /healthz (process alive) and GET /readyz (a real 1-token generation on the engines, and
whether this replica reaches the database).

/readyz answers 200 `ready`; 200 `degraded` (with `reasons`) while the database cannot be reached
but inference serves the keys this replica has cached; 503 + Retry-After when nothing can be
served (no engine generates, or the database is down and no key is cached here)."""

from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, Callable, Optional

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from loraplex.db.health import StoreHealth
from loraplex.ingress.errors import APIError

logger = logging.getLogger(__name__)

# Returns (healthy replicas, total replicas, Serve's deployment status) of the Engine deployment.
# Serve marks a replica healthy only while its check_health, itself a fresh 1-token generation,
# keeps passing.
ReplicaHealth = Callable[[], Awaitable[tuple[int, int, str]]]
# A replica starting or stopping because the pool is being resized (autoscaling, a new replica
# count) is not a failure: /readyz stays 200 while Serve reports one of these.
SCALING = {"UPSCALING", "DOWNSCALING"}


class HealthRoutes:
    def __init__(self, engine, replica_health: Optional[ReplicaHealth] = None, timeout_s: float = 30.0,
                 store_health: Optional[StoreHealth] = None, cached_keys: Optional[Callable[[], int]] = None):
        self.engine = engine
        self.replica_health = replica_health
        self.timeout_s = timeout_s
        self.store_health = store_health  # None: no database behind this app (open, base model only)
        self.cached_keys = cached_keys or (lambda: 0)

    def routes(self) -> list[Route]:
        return [
            Route("/healthz", self.healthz, methods=["GET"]),
            Route("/readyz", self.readyz, methods=["GET"]),
        ]

    async def healthz(self, request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(self, request: Request) -> Response:
        unready = {"Retry-After": "5"}
        try:
            probe = await asyncio.wait_for(self.engine.ready(), self.timeout_s)
        except Exception as exc:  # any failure to generate means not ready
            logger.warning("readiness probe failed: %r", exc)
            raise APIError(503, f"No engine replica could generate a token: {exc!r}", headers=unready) from exc
        body = {"status": "ready", "probe": probe}
        if self.replica_health is not None:
            healthy, total, status = await self.replica_health()
            body.update(healthy_replicas=healthy, replicas=total, deployment_status=status)
            if healthy == 0 or (healthy < total and status not in SCALING):
                body["status"] = "degraded"
                body["reasons"] = [f"{healthy} of {total} engine replicas are healthy ({status})"]
                return JSONResponse(body, status_code=503, headers=unready)
        store = self.store_health
        if store is not None and not store.reachable:
            cached = self.cached_keys()
            body.update(status="degraded", database="unreachable", cached_keys=cached, reasons=[
                f"database unreachable for {store.down_for_s():.0f} s ({store.last_error}): serving the "
                f"{cached} API keys this replica verified; unknown keys, uploads, deletes, usage and admin "
                "answer 503; usage records wait in the spools"])
            # Inference still serves cached tenants: stay in rotation, unless there are none.
            return JSONResponse(body, status_code=200 if cached else 503, headers=None if cached else unready)
        if store is not None:
            body["database"] = "reachable"
        return JSONResponse(body)
