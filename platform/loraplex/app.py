"""build_app(args): the entry point `serve_config.yaml` names (`loraplex.app:build_app`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from ray.serve import Application

from loraplex.cluster import check_at_build, pin_admin_token
from loraplex.config import PlatformConfig


def build_app(args: Optional[dict[str, Any]] = None) -> Application:
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
    engine = engine_deployment(config.engine_deployment).bind(replica_config, home_node_id=home_node_id)
    # The Ingress answers GET /admin/latency against the SLO; Engine replicas never read it.
    ingress_config = replica_config.model_copy(update={"slo": config.slo})
    return ingress_deployment(config.ingress).bind(engine, ingress_config, home_node_id=home_node_id)
