"""GET /healthz (process alive) and GET /readyz (a real 1-token generation on the engines)."""

from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, Callable, Optional

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

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
    def __init__(self, engine, replica_health: Optional[ReplicaHealth] = None, timeout_s: float = 30.0):
        self.engine = engine
        self.replica_health = replica_health
        self.timeout_s = timeout_s

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
            probe = await asyncio.wait_for(self.engine.call("ready"), self.timeout_s)
        except Exception as exc:  # any failure to generate means not ready
            logger.warning("readiness probe failed: %r", exc)
            raise APIError(503, f"No engine replica could generate a token: {exc!r}", headers=unready) from exc
        body = {"status": "ready", "probe": probe}
        if self.replica_health is not None:
            healthy, total, status = await self.replica_health()
            body.update(healthy_replicas=healthy, replicas=total, deployment_status=status)
            if healthy == 0 or (healthy < total and status not in SCALING):
                body["status"] = "degraded"
                return JSONResponse(body, status_code=503, headers=unready)
        return JSONResponse(body)
