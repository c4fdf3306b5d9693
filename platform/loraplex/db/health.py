"""StoreHealth: whether this process can reach the database, as its last queries found.

Whoever queries records the outcome (`ok()`, `failed(exc)`): the ingress's key-cache refresher
every period (a ping when it has nothing to refresh), and any route that hit an outage. /readyz
and the `loraplex_database_reachable` gauge read it.
"""

from __future__ import annotations

import threading
import time
from typing import Optional


class StoreHealth:
    def __init__(self, clock=time.time):
        self.clock = clock
        self._lock = threading.Lock()
        self.down_since: Optional[float] = None  # when the first failure of the current outage happened
        self.last_error: Optional[str] = None
        self.last_ok_at: Optional[float] = None

    @property
    def reachable(self) -> bool:
        return self.down_since is None

    def ok(self) -> None:
        with self._lock:
            self.down_since, self.last_error, self.last_ok_at = None, None, self.clock()

    def failed(self, exc: BaseException) -> None:
        with self._lock:
            if self.down_since is None:
                self.down_since = self.clock()
            self.last_error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"

    def down_for_s(self) -> float:
        since = self.down_since
        return 0.0 if since is None else max(self.clock() - since, 0.0)
