"""LastKnown: the database's last answer per key (an adapter resolution, a tenant's adapter
list), for when it cannot be asked or is slow to answer. Bounded, TTL'd; read during an outage,
and for an adapter resolution whose query takes longer than resolve_wait_s (TenantContext), so
while the database answers promptly every request sees its current state (a DELETE holds at once)."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import Any, Callable, Hashable, Optional


class LastKnown:
    def __init__(self, ttl_s: float, max_entries: int, clock=time.monotonic):
        self.ttl_s, self.max_entries, self.clock = ttl_s, max_entries, clock
        self._entries: OrderedDict[Hashable, tuple[Any, float]] = OrderedDict()
        self._lock = threading.Lock()  # filled from the event loop and from worker threads

    def remember(self, key: Hashable, value: Any) -> None:
        with self._lock:
            self._entries[key] = (value, self.clock())
            self._entries.move_to_end(key)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)

    def recall(self, key: Hashable) -> Optional[Any]:
        """The value remembered less than ttl_s ago, else None."""
        with self._lock:
            hit = self._entries.get(key)
            if hit is None or self.clock() - hit[1] >= self.ttl_s:
                return None
            return hit[0]

    def forget(self, match: Callable[[Hashable], bool]) -> None:
        with self._lock:
            for key in [k for k in self._entries if match(k)]:
                del self._entries[key]
