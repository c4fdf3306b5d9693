"""When a stopping Engine replica hands its running calls back to their ingresses (issue 48).

Serve stops a replica (scale-down, `serve deploy` of a new version, a failed health check) by
draining it: it waits for the running requests for the whole graceful period, and calls the
replica's `__del__` only when none is left; the controller force-kills the replica at the end of
the period (ray/serve/_private/replica.py, `_perform_graceful_shutdown`, Ray 2.60). So a request
that outlasts the period is killed with the replica before `__del__` could hand it back. Serve
gives the user's class no stop signal, so the replica reads Serve's own flag (`serve_stopping`)
and hands back what still runs `margin` before the controller's deadline: the ingress moves each
call to another replica while this one is alive (ingress/migration.py), and the replica then
drains, runs `__del__` (vLLM down, its ledger flushed) and exits before the kill.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Optional

logger = logging.getLogger(__name__)

# Before the controller's kill deadline: Serve's stop call reaching the replica late on a busy
# node, its drain loop (graceful_shutdown_wait_loop_s), then `__del__` (vLLM's shutdown, the
# ledger's flush) must all fit in it.
HAND_BACK_MARGIN_S = 10.0


@dataclass
class HandBackClock:
    """When, after Serve began stopping the replica, its running calls go back: `grace_s`
    (graceful_shutdown_timeout_s) less the margin, at most half the period."""

    grace_s: float
    margin_s: float = HAND_BACK_MARGIN_S
    stopping_since: Optional[float] = None  # when the replica was first seen stopping

    @property
    def delay_s(self) -> float:
        return max(self.grace_s - min(self.margin_s, self.grace_s / 2), 0.0)

    def due(self, stopping: bool, now: float) -> bool:
        """Whether the calls running now go back (`stopping`: Serve's flag read now)."""
        if not stopping:
            return False
        if self.stopping_since is None:
            self.stopping_since = now
        return now - self.stopping_since >= self.delay_s


def serve_stopping() -> Optional[Callable[[], bool]]:
    """A reader of Serve's flag `_shutting_down` of this replica (set when the controller's stop
    call arrives); None outside a Serve replica or if Ray's internals moved (the hand-back then
    waits for `__del__`, as before)."""
    try:
        from ray._private.worker import global_worker

        replica = global_worker.actors[global_worker.actor_id]._replica_impl
        if not isinstance(replica._shutting_down, bool):
            return None
    except Exception:  # noqa: BLE001 - not a Serve replica, or another Ray version's internals
        return None
    return lambda: replica._shutting_down
