"""Publisher: copies a replica's gauges into its metrics, and hands the counters it added up to
Ray (Counts), every period, on a daemon thread.

Gauges (KV-cache usage, queue, resident adapters, the ledger's spool) are states, read when it is
time to publish rather than on every change; Ray keeps a gauge's value for two export intervals,
so a replica publishes well within that. The thread is independent of the request path and of
the ledger's flush thread: a stuck flush shows as a stale `last flush` gauge, not a missing one.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Sequence

logger = logging.getLogger(__name__)

_ERROR_LOG_INTERVAL_S = 300.0


class Publisher:
    def __init__(self, period_s: float, sources: Sequence[Callable[[], None]], name: str = "loraplex-metrics"):
        self.period_s = period_s
        self.sources = list(sources)
        self.name = name
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._logged: dict[int, float] = {}

    def start(self) -> "Publisher":
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()
        return self

    def publish_once(self) -> None:
        for i, source in enumerate(self.sources):
            try:
                source()
            except Exception:
                now = time.monotonic()
                if now - self._logged.get(i, -_ERROR_LOG_INTERVAL_S) >= _ERROR_LOG_INTERVAL_S:
                    self._logged[i] = now
                    logger.warning("metrics source %s failed (logged at most every %.0f s)",
                                   getattr(source, "__qualname__", source), _ERROR_LOG_INTERVAL_S, exc_info=True)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        # At once, so the gauges exist from the replica's start; then every period. Never on the
        # caller's thread: a source may wait for the replica's event loop.
        self.publish_once()
        while not self._stop.wait(self.period_s):
            self.publish_once()
