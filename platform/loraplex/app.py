"""build_app(args): the entry point `serve_config.yaml` names (`loraplex.app:build_app`);
build_platform(args, engine_cls=...): the one place the deployments are wired, which build_app
calls: benchmarks that need a fake engine pass `engine_cls`, and get the same cluster checks and
admin-token pin as `serve run`."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Optional

from ray.serve import Application

from loraplex.cluster import check_at_build, pin_admin_token, without_admin_token
from loraplex.config import PlatformConfig
from loraplex.engine.config import EngineDeploymentConfig

logger = logging.getLogger(__name__)


def build_app(args: Optional[dict[str, Any]] = None) -> Application:
    """`serve run` / `serve deploy`'s builder: Serve calls an application builder with exactly one
    parameter (it refuses a signature with more, keyword-only included)."""
    return build_platform(args)


def build_platform(args: Optional[dict[str, Any]] = None, *, engine_cls: Optional[type] = None) -> Application:
    """The Ingress + Engine application for `args` (serve_config.yaml's `args:`). `engine_cls`:
    the engine each Engine replica drives (a contract.EngineBackend; default VLLMEngine), e.g.
    bench/fake_engine.py's BenchmarkFakeEngine; it must be importable in the replicas."""
    # Replicas run in other working directories: pin relative paths to where we started.
    config = PlatformConfig.from_args(args).resolved(Path.cwd())
    # On a multi-node cluster, SQLite or a node-local adapter store is refused here (Serve shows
    # the message as the app's DEPLOY_FAILED status); replicas check again where they start.
    home_node_id = check_at_build(config)
    # After the check: importing the deployments imports vLLM (~10 s), and Serve retries a
    # failed build three times; a refusal comes back in seconds.
    from loraplex.engine.deployment import engine_deployment
    from loraplex.ingress.deployment import ingress_deployment

    # The admin token resolved here (the env var where the app is built, else the config)
    # reaches every node's Ingress replicas, and only those: Engine and merged replicas never
    # answer /admin, so theirs carries none (least privilege: a replica's init args, logs or a
    # heap dump cannot leak what it was never given).
    replica_config = without_admin_token(config.for_replicas())
    engine_kwargs = {} if engine_cls is None else {"engine_cls": engine_cls}
    # One Engine pool per base model, each with its own router and fair queue; the first is
    # `Engine`, the one a single-model config always had.
    pools = {base.model_id: engine_deployment(base.engine_deployment, name=config.pool_name(base.model_id)).bind(
        replica_config.for_model(base.model_id), home_node_id=home_node_id, **engine_kwargs)
        for base in config.bases()}
    engine = pools[config.base_names[0]]
    # One Engine deployment per dedicated version: the same class, its base model the version
    # merged into the served model's weights (loraplex/dedicated).
    dedicated = dedicated_targets(config)
    merged = {t.adapter_id: engine_deployment(dedicated_deployment(config, t), name=t.deployment_name).bind(
        replica_config.for_model(t.base_model if t.base_model in pools else None), home_node_id=home_node_id,
        dedicated=t, **engine_kwargs) for t in dedicated}
    # The Ingress answers GET /admin/latency against the SLO; Engine replicas never read it.
    ingress_config = pin_admin_token(replica_config, config.tenancy.resolved_admin_token()).model_copy(
        update={"slo": config.slo})
    return ingress_deployment(config.ingress).bind(engine, ingress_config, home_node_id=home_node_id,
                                                   dedicated=dedicated, dedicated_handles=merged,
                                                   pools={name: pool for name, pool in pools.items() if pool is not engine})


def dedicated_targets(config: PlatformConfig) -> list:
    """The versions dedicated by the config and (dedicated.admin_marks) by the admin route, as the
    catalog has them now; none without a config list or an admin mark (no database opened for it)."""
    from sqlalchemy import inspect, make_url
    from sqlalchemy.exc import SQLAlchemyError

    from loraplex.db.engine import make_engine
    from loraplex.dedicated.marks import DedicatedMarks
    from loraplex.dedicated.targets import resolve_targets
    from loraplex.registry.catalog import AdapterCatalog

    if not config.dedicated.adapters and not config.dedicated.admin_marks:
        return []
    url = make_url(config.database_url)
    if url.get_backend_name() == "sqlite" and not Path(url.database or "").exists():
        return []  # a first start: no adapter yet (and no database file made by the build)
    db = make_engine(config.database_url)
    try:
        if not inspect(db).has_table("adapter_versions"):
            return []
        marked = DedicatedMarks(db).live() if config.dedicated.admin_marks else []
        return resolve_targets(config.dedicated, AdapterCatalog(db), marked)
    except SQLAlchemyError as exc:
        # The database down at build: the app still starts, every version on the LoRA pool (a
        # dedicated replica cannot be named without the catalog); the next build adds them.
        logger.warning("no dedicated replicas in this build: the database cannot be read (%r)", exc)
        return []
    finally:
        db.dispose()


def dedicated_deployment(config: PlatformConfig, target) -> EngineDeploymentConfig:
    """A dedicated version's deployment: the Engine's settings, one replica of the target's size."""
    base = config.base(target.base_model if target.base_model in config.base_names else None)
    return base.engine_deployment.model_copy(update={
        "num_replicas": 1, "autoscaling": None, "num_cpus": target.num_cpus, "num_gpus": target.num_gpus})
