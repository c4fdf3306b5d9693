"""The metrics of the replica this process runs, for code Serve builds without our arguments.

Serve builds the ingress's RequestRouter (routing.serve_router) itself, from the Engine
deployment's router config; it runs in the Ingress replica's process, which installs its
Metrics here when it starts. A Serve replica is one process, so one slot per process is right.
"""

from __future__ import annotations

from loraplex.metrics.recorder import DISABLED, Metrics

_installed: Metrics = DISABLED


def install(metrics: Metrics) -> None:
    global _installed
    _installed = metrics


def installed() -> Metrics:
    return _installed
