"""GET /healthz (process alive), GET /readyz (a real 1-token generation on the engines, and
whether this replica reaches the database) and GET /admin/readyz (the same verdict, with details).

/readyz answers 200 `ready`; 200 `degraded` while the database cannot be reached but inference
serves the keys this replica has cached; 503 + Retry-After when nothing can be served (no engine
generates, or the database is down and no key is cached here). It is unauthenticated, so:
- its body is the status alone: the probe's replica id, replica counts, database state and any
  error text (a repr of a Ray or database error names hosts and ports) are for operators, at
  GET /admin/readyz behind the admin token;
- while no engine replica is running yet (the engine is starting), it answers 503 + Retry-After at
  once from the controller's replica counts, without waiting out a generation no replica can run;
- the generation and the controller call behind it run at most once per `cache_s`
  (ingress.ready_cache_s) however often it is asked, one at a time (callers arriving during a
  probe wait for that probe's answer): hammering /readyz costs a dict lookup, not a generation.
The database state is read fresh each time (it is this replica's own memory, no I/O)."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Optional

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from loraplex.db.health import StoreHealth

logger = logging.getLogger(__name__)

# Returns (healthy replicas, total replicas, Serve's deployment status) of the Engine deployment.
# Serve marks a replica healthy only while its check_health, itself a fresh 1-token generation,
# keeps passing.
ReplicaHealth = Callable[[], Awaitable[tuple[int, int, str]]]
# A replica starting or stopping because the pool is being resized (autoscaling, a new replica
# count) is not a failure: /readyz stays 200 while Serve reports one of these.
SCALING = {"UPSCALING", "DOWNSCALING"}
UNREADY = {"Retry-After": "5"}


@dataclass
class _Probe:
    """One generation + controller reading, reused for cache_s."""

    at: float
    probe: Any = None  # engine.ready()'s answer
    error: Optional[BaseException] = None  # why it failed (admin route only)
    replicas: Optional[tuple[int, int, str]] = None
    starting: bool = False  # no engine replica running: no generation was tried


class HealthRoutes:
    def __init__(self, engine, replica_health: Optional[ReplicaHealth] = None, timeout_s: float = 30.0,
                 store_health: Optional[StoreHealth] = None, cached_keys: Optional[Callable[[], int]] = None,
                 cache_s: float = 3.0, check_admin: Optional[Callable[[Request], None]] = None,
                 clock: Callable[[], float] = time.monotonic):
        self.engine = engine
        self.replica_health = replica_health
        self.timeout_s = timeout_s
        self.store_health = store_health  # None: no database behind this app (open, base model only)
        self.cached_keys = cached_keys or (lambda: 0)
        self.cache_s = cache_s
        self.check_admin = check_admin  # None: no admin API (an open server), so no details route
        self.clock = clock
        self.probes = 0  # generations run (what the cache saves)
        self._last: Optional[_Probe] = None
        self._lock = asyncio.Lock()

    def routes(self) -> list[Route]:
        routes = [
            Route("/healthz", self.healthz, methods=["GET"]),
            Route("/readyz", self.readyz, methods=["GET"]),
        ]
        if self.check_admin is not None:
            routes.append(Route("/admin/readyz", self.admin_readyz, methods=["GET"]))
        return routes

    async def healthz(self, request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(self, request: Request) -> Response:
        status_code, body, headers = await self.report()
        return JSONResponse({"status": body["status"]}, status_code=status_code, headers=headers)

    async def admin_readyz(self, request: Request) -> Response:
        self.check_admin(request)
        status_code, body, headers = await self.report()
        return JSONResponse(body, status_code=status_code, headers=headers)

    async def report(self) -> tuple[int, dict, Optional[dict]]:
        """(status code, the detailed body, headers) of the readiness verdict now."""
        last = await self._probe()
        if last.starting:
            healthy, total, status = last.replicas  # nothing running: the generation was not tried
            return 503, {"status": "unready", "healthy_replicas": healthy, "replicas": total,
                         "deployment_status": status, "reasons": [
                             f"no engine replica is running yet (0 of {total}, {status}): "
                             "the engine is starting"]}, UNREADY
        if last.error is not None:
            return 503, {"status": "unready", "reasons": [
                f"no engine replica could generate a token: {last.error!r}"]}, UNREADY
        body: dict = {"status": "ready", "probe": last.probe, "probed_s_ago": round(self.clock() - last.at, 3)}
        if last.replicas is not None:
            healthy, total, status = last.replicas
            body.update(healthy_replicas=healthy, replicas=total, deployment_status=status)
            if healthy == 0 or (healthy < total and status not in SCALING):
                body["status"] = "degraded"
                body["reasons"] = [f"{healthy} of {total} engine replicas are healthy ({status})"]
                return 503, body, UNREADY
        store = self.store_health
        if store is not None and not store.reachable:
            cached = self.cached_keys()
            body.update(status="degraded", database="unreachable", cached_keys=cached, reasons=[
                f"database unreachable for {store.down_for_s():.0f} s ({store.last_error}): serving the "
                f"{cached} API keys this replica verified; unknown keys, uploads, deletes, usage and admin "
                "answer 503; usage records wait in the spools"])
            # Inference still serves cached tenants: stay in rotation, unless there are none.
            return (200, body, None) if cached else (503, body, UNREADY)
        if store is not None:
            body["database"] = "reachable"
        return 200, body, None

    async def _probe(self) -> _Probe:
        async with self._lock:  # one probe at a time: the rest wait for its answer
            last = self._last
            if last is not None and self.clock() - last.at < self.cache_s:
                return last
            fresh = _Probe(at=self.clock())
            if self.replica_health is not None:  # first: a starting engine answers at once
                try:
                    fresh.replicas = await self.replica_health()
                except Exception as exc:
                    logger.warning("readiness: the Engine deployment's status could not be read: %r", exc)
                    fresh.error = exc
            fresh.starting = fresh.replicas is not None and fresh.replicas[0] == 0
            if fresh.error is None and not fresh.starting:
                self.probes += 1
                try:
                    fresh.probe = await asyncio.wait_for(self.engine.ready(), self.timeout_s)
                except Exception as exc:  # any failure to generate means not ready
                    logger.warning("readiness probe failed: %r", exc)
                    fresh.error = exc
            self._last = fresh
            return fresh
