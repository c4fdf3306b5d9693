"""Ingress: the Ray Serve deployment that serves the Starlette app."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import ray
from ray import serve

from loraplex import disk_full, store_io
from loraplex.ingress.config import IngressDeploymentConfig
from loraplex.ingress.engine_client import ServeEngineClient
from loraplex.ingress.overload import serve_max_ongoing_requests
from loraplex.metrics.recorder import Metrics
from loraplex.metrics import recorder as process_metrics
from loraplex.metrics.publisher import Publisher

if TYPE_CHECKING:  # annotations only: the root config imports this package's config, never the reverse
    from loraplex.config import PlatformConfig


class Ingress:
    def __init__(self, engine_handle, config: PlatformConfig, home_node_id: str | None = None,
                 dedicated: list | None = None, dedicated_handles: dict | None = None, pools: dict | None = None):
        from loraplex.accounting.accounting import Accounting
        from loraplex.cluster import check_on_replica, for_this_node
        from loraplex.db.engine import make_engine
        from loraplex.registry.registry import build_registry
        from loraplex.tenancy.tenancy import Tenancy

        # Node-local state away from the node the app was deployed on: refuse (loraplex/cluster.py).
        check_on_replica(config, home_node_id, "Ingress")
        config = for_this_node(config)
        self.engine = ServeEngineClient(engine_handle)
        self.config = config
        context = serve.get_replica_context()
        self.app_name = context.app_name
        db = make_engine(config.database_url)
        # Several base models: each call goes to its base's pool (`engine_handle` is the first's).
        if pools:
            from loraplex.ingress.engine_pools import PooledEngineClient

            self.engine = PooledEngineClient({config.base_names[0]: self.engine, **{
                name: ServeEngineClient(pools[name]) for name in config.base_names[1:]}})
        # Dedicated replicas (loraplex/dedicated): their versions' calls go there while healthy.
        self.dedicated = self.dedicated_health = None
        if dedicated:
            from loraplex.dedicated.engine_client import PathChoosingEngineClient
            from loraplex.dedicated.health import HealthPoller
            from loraplex.dedicated.marks import DedicatedMarks
            from loraplex.dedicated.path_choice import DedicatedPaths

            self.dedicated = DedicatedPaths.of(dedicated, config.dedicated.failure_backoff_s)
            merged = {i: ServeEngineClient(handle) for i, handle in (dedicated_handles or {}).items()}
            self.engine = PathChoosingEngineClient(self.engine, merged, self.dedicated)
            self.dedicated_health = HealthPoller(self.dedicated, DedicatedMarks(db), self.app_name,
                                                 config.dedicated.health_poll_s).start()
        self.tenancy = Tenancy.from_config(config.tenancy, db, known_plans=config.plan_names(),
                                           known_bases=config.base_names)
        self.tenancy.keys.start()  # re-verifies cached keys every refresh_s / 2
        self.registry = build_registry(config, db)
        self.accounting = Accounting.start(
            config.accounting, db, f"ingress-{context.replica_id.unique_id}", plan_of=self.tenancy.service.plan_of
        )
        self.limiter = shared_limiter(config, self.app_name, f"ingress-{context.replica_id.unique_id}")
        # Idempotency-Key records shared by every Ingress replica of the app (ingress/idempotency.py).
        self.idempotency = None
        if config.ingress.idempotency_window_s:
            from loraplex.ingress.idempotency import RayIdempotency

            self.idempotency = RayIdempotency(self.app_name, config.ingress.idempotency_window_s)
        self.owner = ray.get_runtime_context().get_actor_name() or f"ingress-{context.replica_id.unique_id}"
        self.metrics = Metrics.for_replica(config.metrics, "ingress", base_model=config.engine.model_id)
        if self.metrics.enabled:  # the adapter store and disk failure counters, exported at 0
            store_io.FAILURES.start()
            disk_full.FAILURES.start()
        process_metrics.install(self.metrics)  # for the router Serve runs in this process
        self.publisher = None
        if self.metrics.enabled:
            ledger = self.accounting.ledger
            self.publisher = Publisher(config.metrics.publish_period_s, [
                self.metrics.flush,
                lambda: self.metrics.replica.ledger(ledger.last_flush_at, ledger.pending_records(),
                                                    ledger.unspooled_records()),
                lambda: self.metrics.replica.database(self.tenancy.keys.health.reachable),
            ], name=f"metrics-{context.replica_id.unique_id}").start()

    def __serve_build_asgi_app__(self):
        # Imported here: the app's build imports this module, and need not import vLLM (its protocol).
        from loraplex.serve_log import keep_serve_log_open

        keep_serve_log_open()  # vLLM configures logging on its import (serve_log.py)
        from vllm.utils.gc_utils import freeze_gc_heap

        from loraplex.ingress.app import build_ingress_app

        app = build_ingress_app(
            self.engine, self.config, self.engine_replica_health, tenancy=self.tenancy, registry=self.registry,
            accounting=self.accounting, limiter=self.limiter, metrics=self.metrics, dedicated=self.dedicated,
            run_batches=True,  # every replica runs batches, each claimed by one at a time (a lease)
            idempotency=self.idempotency, owner=self.owner,
        )
        # What this process holds from now on (~680k objects: vLLM's protocol imports torch) is
        # never garbage: kept out of the collector, a full collection scans the requests' objects
        # only, not ~180 ms of the heap in the middle of a burst (vLLM's API server does the same).
        freeze_gc_heap()
        return app

    def __del__(self):
        if self.publisher is not None:
            self.publisher.stop()
            self.metrics.flush()  # what the last period added up
        self.limiter.close()
        if self.dedicated_health is not None:
            self.dedicated_health.close()
        self.tenancy.keys.close()
        self.accounting.close()

    async def engine_replica_health(self) -> tuple[int, int, str]:
        """(running, total, status) of the Engine pools: every base's replicas added up; the
        status is the first pool's that is not HEALTHY, else HEALTHY."""
        # serve.status() blocks on the controller; keep it off the event loop.
        deployments = (await asyncio.to_thread(serve.status)).applications[self.app_name].deployments
        running = total = 0
        worst = "HEALTHY"
        for name in self.config.base_names:
            status = deployments[self.config.pool_name(name)]
            counts = status.replica_states
            running, total = running + counts.get("RUNNING", 0), total + sum(counts.values())
            value = str(getattr(status.status, "value", status.status))
            worst = value if worst == "HEALTHY" else worst
        return running, total, worst


def shared_limiter(config: PlatformConfig, app_name: str, holder: str):
    """Tenant limits shared by every ingress replica of the app: leases from limiter actors."""
    from loraplex.admission.limiter import Limiter
    from loraplex.admission.ray_backend import RayBackend

    cfg = config.tenancy.limiter
    backend = RayBackend(app_name, config.database_url, shards=cfg.shards, budget_cache_s=cfg.budget_cache_s,
                         timeout_s=cfg.acquire_timeout_s, startup_timeout_s=cfg.startup_timeout_s,
                         on_unavailable=cfg.on_unavailable)
    return Limiter(backend, cfg, holder=holder)


GRACE_MARGIN_S = 10.0  # past the last deadline: the deadline's own error event and the usage record


def ingress_deployment(config: IngressDeploymentConfig):
    return serve.deployment(
        serve.ingress()(Ingress),
        name="Ingress",
        num_replicas=config.num_replicas,
        # Far above the app's own bound (ingress/overload.py), which refuses at once: a replica
        # at Serve's bound stalls the HTTP proxy's routing to it.
        max_ongoing_requests=serve_max_ongoing_requests(config.max_ongoing_requests),
        # A stopping Ingress replica (scale-down, `serve deploy` of a new version) holds its clients'
        # connections, which no other process can finish: it waits for them, and none outlives its
        # deadline. Serve's default (20 s) cut every longer stream. It waits only while requests run.
        graceful_shutdown_timeout_s=config.request_timeout_s + GRACE_MARGIN_S,
        ray_actor_options={"num_cpus": config.num_cpus},
    )
