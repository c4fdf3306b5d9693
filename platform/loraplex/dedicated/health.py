"""The ingress thread that keeps DedicatedPaths current: every `health_poll_s`, Serve's status of
the dedicated deployments and the live admin marks (a deleted adapter's mark is not live)."""

from __future__ import annotations

import logging
import threading

from loraplex.dedicated.marks import DedicatedMarks
from loraplex.dedicated.path_choice import DedicatedPaths

logger = logging.getLogger(__name__)


def deployment_health(app_name: str) -> dict[str, tuple[str, int]]:
    """deployment name -> (status, RUNNING replicas), from the Serve controller."""
    from ray import serve

    app = serve.status().applications.get(app_name)
    if app is None:
        return {}
    return {name: (str(getattr(d.status, "value", d.status)), d.replica_states.get("RUNNING", 0))
            for name, d in app.deployments.items()}


class HealthPoller:
    def __init__(self, paths: DedicatedPaths, marks: DedicatedMarks, app_name: str, period_s: float,
                 read_health=deployment_health):
        self.paths, self.marks, self.app_name, self.period_s = paths, marks, app_name, period_s
        self.read_health = read_health
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dedicated-health", daemon=True)

    def start(self) -> "HealthPoller":
        self._thread.start()
        return self

    def poll_once(self) -> None:
        self.paths.observe(self.read_health(self.app_name), self.marks.live_ids())

    def _run(self) -> None:
        while True:
            try:
                self.poll_once()
            except Exception as exc:  # the controller or the database away: keep the last view
                logger.warning("cannot read the dedicated replicas' health (%r); retrying", exc)
            if self._stop.wait(self.period_s):
                return

    def close(self) -> None:
        self._stop.set()
