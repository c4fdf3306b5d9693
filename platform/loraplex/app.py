"""build_app(args): the entry point `serve_config.yaml` names (`loraplex.app:build_app`);
build_platform(args, engine_cls=...): the one place the deployments are wired, which build_app
calls: benchmarks that need a fake engine pass `engine_cls`, and get the same cluster checks and
admin-token pin as `serve run`."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from ray.serve import Application

from loraplex.cluster import check_at_build, pin_admin_token
from loraplex.config import PlatformConfig


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
    # reaches every node's replicas.
    replica_config = pin_admin_token(config.for_replicas(), config.tenancy.resolved_admin_token())
    engine_kwargs = {} if engine_cls is None else {"engine_cls": engine_cls}
    engine = engine_deployment(config.engine_deployment).bind(replica_config, home_node_id=home_node_id,
                                                              **engine_kwargs)
    # The Ingress answers GET /admin/latency against the SLO; Engine replicas never read it.
    ingress_config = replica_config.model_copy(update={"slo": config.slo})
    return ingress_deployment(config.ingress).bind(engine, ingress_config, home_node_id=home_node_id)
