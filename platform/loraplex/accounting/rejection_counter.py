import threading
from collections import Counter
from datetime import datetime, timezone

UNKNOWN_TENANT = "-"  # 401s: no key, so no tenant to attribute to


class RejectionCounter:
    """In-memory counts of requests refused before the engine (401/404/429/...), per tenant,
    reason and UTC hour. Never billable; the ledger drains it into the spool on each flush, so a
    crash loses at most one flush interval of these counts (they are diagnostics, not money)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._counts: Counter[tuple[str, str, str]] = Counter()

    def add(self, tenant_id: str | None, reason: str, at: datetime | None = None, n: int = 1) -> None:
        at = (at or datetime.now(timezone.utc)).astimezone(timezone.utc)
        hour = at.replace(minute=0, second=0, microsecond=0).isoformat()
        with self._lock:
            self._counts[(tenant_id or UNKNOWN_TENANT, reason, hour)] += n

    def drain(self) -> list[list]:
        with self._lock:
            counts, self._counts = self._counts, Counter()
        return [[t, r, h, n] for (t, r, h), n in sorted(counts.items())]
