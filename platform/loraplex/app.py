"""build_app(args): the entry point `serve_config.yaml` names (`loraplex.app:build_app`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from ray.serve import Application

from loraplex.config import PlatformConfig
from loraplex.engine.deployment import engine_deployment
from loraplex.ingress.deployment import ingress_deployment


def build_app(args: Optional[dict[str, Any]] = None) -> Application:
    # Replicas run in other working directories: pin relative paths to where we started.
    config = PlatformConfig.from_args(args).resolved(Path.cwd())
    replica_config = config.for_replicas()
    engine = engine_deployment(config.engine_deployment).bind(replica_config)
    return ingress_deployment(config.ingress).bind(engine, replica_config)
