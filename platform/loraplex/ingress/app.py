"""The ingress's Starlette app: every route, plus OpenAI-style bodies for every error."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from typing import TYPE_CHECKING

from ray.exceptions import TaskCancelledError
from sqlalchemy.exc import SQLAlchemyError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request

from loraplex.admission.limiter import Limiter, LocalBackend
from loraplex.db.health import StoreHealth
from loraplex.db.unavailable import StoreBusy, StoreUnavailable, is_pool_exhausted, is_unavailable
from loraplex.ingress.adapter_routes import AdapterRoutes
from loraplex.ingress.admin_adapter_routes import AdminAdapterRoutes
from loraplex.ingress.admin_routes import AdminRoutes
from loraplex.ingress.auth import authenticate, check_admin
from loraplex.ingress.console_routes import console_routes
from loraplex.ingress.dedicated_routes import DedicatedRoutes
from loraplex.errors import StatusError
from loraplex.ingress.errors import error_response
from loraplex.ingress.health_routes import HealthRoutes, ReplicaHealth
from loraplex.ingress.latency_routes import LatencyRoutes
from loraplex.ingress.idempotency import LocalIdempotency
from loraplex.ingress.openai_routes import OpenAIRoutes
from loraplex.ingress.overload import GenerationBound
from loraplex.ingress.request_size import server_bound
from loraplex.ingress.tenant_context import TenantContext
from loraplex.ingress.upload_pool import UploadPool
from loraplex.ingress.usage_routes import UsageRoutes
from loraplex.routing.served_keys import replica_statuses
from loraplex.tenancy.tenancy import Tenancy

if TYPE_CHECKING:  # annotations only: the root config imports this package's config, never the reverse
    from loraplex.config import PlatformConfig

logger = logging.getLogger(__name__)


async def engine_replicas(engine) -> list[dict]:
    """Every Engine replica: the one a call reaches, asked now, and the others as their last
    routing stats reported them (up to routing.stats_period_s old; each carries reported_at)."""
    statuses = {s["replica_id"]: s for s in replica_statuses()}
    live = await engine.replica_status()
    if isinstance(live, dict):
        statuses[live.get("replica_id")] = live
    return [statuses[k] for k in sorted(statuses, key=str)]


def build_ingress_app(
    engine,
    config: PlatformConfig,
    replica_health: ReplicaHealth | None = None,
    tenancy: Tenancy | None = None,
    registry=None,
    accounting=None,
    limiter=None,
    metrics=None,
    dedicated=None,
    run_batches: bool = False,
    idempotency=None,
    owner: str = "local",
) -> Starlette:
    """`tenancy`: tenants, keys and the admin token; with it every /v1 route needs a tenant key.
    `registry`: tenants' adapters (needs tenancy). None for both: an open base-model-only server.
    `accounting`: loraplex.accounting.Accounting, for rejection counts and the usage routes.
    `limiter`: loraplex.admission.Limiter enforcing tenant limits; None: one in this process.
    `metrics`: the replica's loraplex.metrics.Metrics (refusals, requests billed here); None: none.
    `dedicated`: the app's dedicated versions and their health (loraplex.dedicated.path_choice.DedicatedPaths).
    `run_batches`: run a batch runner in this app's event loop (its lifespan); the app's state
    holds it as `batch_runner` either way (None without the Batch API)."""
    tenants = None
    # What this replica's queries found of the database: /readyz and the outage mapping below.
    health = tenancy.keys.health if tenancy is not None else StoreHealth()
    if tenancy is not None:
        key_cache = config.tenancy.key_cache
        tenants = TenantContext(
            lambda request: authenticate(request, tenancy),
            registry,
            base_model=config.engine.model_id,
            cache_salt_per_tenant=config.registry.cache_salt_per_tenant,
            health=health, outage_ttl_s=key_cache.ttl_s, outage_entries=key_cache.max_entries,
            resolve_wait_s=key_cache.resolve_wait_s,
            plan_weight=config.tenancy.plan_weight, bases=config.base_names, slo_targets=config.slo.targets,
        )
    openai = OpenAIRoutes(engine, config.ingress.max_request_body_bytes, tenants,
                          ledger=accounting.ledger if accounting is not None else None,
                          base_model=config.engine.model_id,
                          request_timeout_s=config.ingress.request_timeout_s,
                          limits=limiter or Limiter(LocalBackend(), config.tenancy.limiter),
                          metrics=metrics.requests if metrics is not None else None,
                          body_timeout_s=config.ingress.body_timeout_s, max_model_len=config.engine.max_model_len,
                          max_body_reads_per_tenant=config.ingress.max_body_reads_per_tenant,
                          max_sequences={b.model_id: server_bound(b.engine.max_num_seqs) for b in config.bases()},
                          max_migrations=config.ingress.max_migrations,
                          replica_metrics=metrics.replica if metrics is not None else None,
                          idempotency=idempotency if idempotency is not None or not config.ingress.idempotency_window_s
                          else LocalIdempotency(config.ingress.idempotency_window_s), owner=owner)
    routes = [
        *openai.routes(),
        *HealthRoutes(engine, replica_health, store_health=health if tenancy is not None else None,
                      cached_keys=(lambda: len(tenancy.keys)) if tenancy is not None else None,
                      cache_s=config.ingress.ready_cache_s,
                      check_admin=(lambda request: check_admin(request, tenancy)) if tenancy is not None else None,
                      ).routes(),
    ]
    if tenancy is not None:
        routes += AdminRoutes(tenancy, replicas=lambda: engine_replicas(engine)).routes()
    if registry is not None and tenants is not None:
        uploads = UploadPool(config.registry.upload_workers, config.registry.uploads_per_tenant)
        routes += AdapterRoutes(tenants, config.registry.max_upload_bytes, uploads, on_refused=openai.refused).routes()
        routes += AdminAdapterRoutes(tenancy, registry, {b.model_id: b.engine for b in config.bases()}).routes()
        routes += DedicatedRoutes(tenancy, registry, dedicated).routes()
    if accounting is not None and tenancy is not None:
        routes += UsageRoutes(accounting, tenants, tenancy).routes()
        routes += LatencyRoutes(tenancy, accounting.db, config.slo, config.console).routes()
    batch_runner = None
    if config.batches.enabled and registry is not None and tenants is not None and accounting is not None:
        batch_routes, batch_runner = batch_api(config, tenants, tenancy, accounting.db, openai)
        routes += batch_routes
    quality_runner = None
    if config.quality.enabled and batch_runner is not None:
        quality_routes, quality_runner = quality_api(config, tenants, tenancy, accounting.db, batch_runner)
        routes += quality_routes
    routes += console_routes()

    async def on_status_error(request: Request, exc: StatusError):
        return error_response(exc)

    async def on_http_error(request: Request, exc: HTTPException):
        return error_response(StatusError(f"{request.method} {request.url.path}: {exc.detail}",
                                          status=exc.status_code))

    async def on_database_error(request: Request, exc: SQLAlchemyError):
        # The one place a route's database error becomes an answer: the database is down (503 +
        # Retry-After, never a 500), or it is a bug (500, logged).
        if not is_unavailable(exc):
            return await on_unexpected(request, exc)
        if is_pool_exhausted(exc):  # every connection busy: the database is up, so no outage
            return error_response(StoreBusy(f"{request.method} {request.url.path} cannot be answered now"))
        health.failed(exc)
        logger.warning("database unavailable on %s %s: %r", request.method, request.url.path, exc)
        return error_response(StoreUnavailable(f"{request.method} {request.url.path} cannot be answered now", exc))

    async def on_unexpected(request: Request, exc: Exception):
        # Ray Serve raises TaskCancelledError from receive() when the client has gone away:
        # nobody is left to answer, so it is not worth a stack trace.
        if not isinstance(exc, TaskCancelledError):
            logger.exception("unhandled error on %s %s", request.method, request.url.path)
        return error_response(StatusError(
            f"Internal error: {type(exc).__name__}. The server keeps serving; retry or report it."))

    # Outermost but for Starlette's error middleware: a request past the bound costs no routing.
    # Its refusal is counted before authentication: no tenant.
    bound = Middleware(GenerationBound, limit=config.ingress.max_ongoing_requests,
                       paths=OpenAIRoutes.GENERATION_PATHS, on_refused=lambda reason: openai.refused(None, reason))
    @contextlib.asynccontextmanager
    async def lifespan(app):
        tasks = []
        if run_batches:
            tasks = [(r, asyncio.create_task(r.run_forever(), name=name))
                     for r, name in ((batch_runner, "batch-runner"), (quality_runner, "quality-runner")) if r]
        try:
            yield
        finally:
            for runner, task in tasks:
                runner.stop()
                await task

    app = Starlette(
        routes=routes,
        exception_handlers={StatusError: on_status_error, HTTPException: on_http_error,
                            SQLAlchemyError: on_database_error, Exception: on_unexpected},
        middleware=[bound],
        lifespan=lifespan,
    )
    app.state.batch_runner = batch_runner
    app.state.quality_runner = quality_runner
    return app


def batch_api(config: PlatformConfig, tenants: TenantContext, tenancy: Tenancy, db, openai: OpenAIRoutes):
    """The Batch API's routes and this replica's runner (its lines through `openai`'s path)."""
    from loraplex.batches.day_tokens import BatchDayTokens
    from loraplex.batches.files import BatchFileStore
    from loraplex.batches.repository import BatchRepository
    from loraplex.batches.runner import BatchRunner
    from loraplex.batches.tables import MIGRATIONS
    from loraplex.db.migrations import migrate
    from loraplex.ingress.batch_lines import BatchLines
    from loraplex.ingress.batch_routes import BatchRoutes
    from loraplex.ingress.file_routes import FileRoutes

    migrate(db, MIGRATIONS)
    repo = BatchRepository(db)
    files = BatchFileStore(config.registry.store_url, config.registry.storage_options,
                           config.registry.store_timeout_s)
    cfg = config.batches
    routes = FileRoutes(tenants, repo, files, cfg).routes() + BatchRoutes(tenants, repo, files, cfg).routes()
    lines = BatchLines(openai, tenancy.service, cfg.line_timeout_s, BatchDayTokens(db, repo.clock))
    return routes, BatchRunner(repo, files, cfg, lines, owner=f"runner-{uuid.uuid4().hex[:12]}")


def quality_api(config: PlatformConfig, tenants: TenantContext, tenancy: Tenancy, db, batch_runner):
    """Quality runs' routes and this replica's runner (its batches through the Batch API's runner)."""
    from loraplex.ingress.quality_routes import QualityRoutes
    from loraplex.quality.repository import QualityRepository
    from loraplex.quality.runner import QualityRunner

    runs = QualityRepository(db)
    routes = QualityRoutes(tenants, tenancy, runs, batch_runner.repo, batch_runner.files, config.quality,
                           config.batches.max_line_bytes).routes()
    return routes, QualityRunner(runs, batch_runner.repo, batch_runner.files, config.quality, config.batches)
