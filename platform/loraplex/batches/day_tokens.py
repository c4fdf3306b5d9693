"""BatchDayTokens: a tenant's `batch_tokens_per_day`, the tokens (prompt + completion, as billed)
its batch lines may use per UTC day.

What the day used is read from the ledger (the tenant's `batch` usage records since 00:00 UTC)
plus what this runner holds: each line in flight its estimate (its prompt and max_tokens, the
admission charge), each line ended but not yet in the ledger (the spool flushes every second) what
it used. A line that would pass the limit is not failed: its batch parks until the next UTC day
(`park_until`). While it would fit but for the lines in flight, it waits for them (a short retry).

Overshoot bound: the day can end past the limit by at most what the lines in flight when it was
reached use. Runners on other Ingress replicas do not see each other's lines in flight ((replicas
- 1) x batches.lines_in_flight lines, each at most its prompt + max_tokens); a runner's own lines
count at their estimate until they end (the prompt's is ~4 characters a token: a little short).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Callable, Optional

from sqlalchemy import Engine

from loraplex.accounting.usage_query import tokens_since
from loraplex.batches.results import LineResult

HELD_TTL_S = 300.0  # a line ended this long ago and still not in the ledger was not billed: stop counting it


def day_start(now: datetime) -> datetime:
    return now.replace(hour=0, minute=0, second=0, microsecond=0)


def next_day(now: datetime) -> datetime:
    return day_start(now) + timedelta(days=1)


def day_to_date(db: Engine, tenant_id: str, day: datetime, request_ids: list[str]) -> tuple[float, set[str]]:
    """(prompt + completion tokens of the tenant's batch records finished since `day`; which of
    `request_ids` the ledger has): usage_query.tokens_since."""
    return tokens_since(db, tenant_id, day, request_ids, batch_only=True)


@dataclass
class _Held:
    tokens: float
    ended_at: Optional[float] = None  # monotonic; None: in flight


class BatchDayTokens:
    def __init__(self, db: Engine, clock: Callable[[], datetime], read=day_to_date):
        self.db, self.clock, self.read = db, clock, read
        self._held: dict[str, dict[str, _Held]] = {}  # tenant -> line request id -> its tokens
        self._lock = asyncio.Lock()  # one read-then-hold at a time: two lines never both fit the same room

    async def take(self, tenant: str, limit: Optional[int], request_id: str, charge: float) -> Optional[LineResult]:
        """None: the line may run (its charge is held until `settle`); else the refusal it gets."""
        if limit is None:
            return None
        if charge > limit:  # it can never fit a day: waiting would only reach the window's end
            return LineResult(429, _error(f"This request needs up to {int(charge)} tokens (prompt + max_tokens) "
                                          f"and your batch_tokens_per_day is {limit}: lower its max_tokens."))
        async with self._lock:
            held = self._held.setdefault(tenant, {})
            now = time.monotonic()
            for rid in [r for r, h in held.items() if h.ended_at is not None and now - h.ended_at > HELD_TTL_S]:
                del held[rid]
            today = self.clock()
            used, present = await asyncio.to_thread(self.read, self.db, tenant, day_start(today), list(held))
            for rid in present:
                held.pop(rid, None)
            used += sum(h.tokens for h in held.values() if h.ended_at is not None)
            flying = sum(h.tokens for h in held.values() if h.ended_at is None)
            if used + charge > limit:
                until = next_day(today)
                return LineResult(429, _error(f"Your batch lines used {int(used)} tokens today and your "
                                              f"batch_tokens_per_day is {limit}: the batch waits until "
                                              f"{until.isoformat()}."), retry=True, park_until=until)
            if used + flying + charge > limit:  # it may fit once the lines in flight end below their estimate
                return LineResult(429, _error("Waiting for the batch lines in flight (batch_tokens_per_day)."),
                                  retry=True)
            held[request_id] = _Held(charge)
        return None

    def settle(self, tenant: str, request_id: str, used: Optional[float]) -> None:
        """The line ended: `used` tokens (held until the ledger has its record); None: nothing billed."""
        held = self._held.get(tenant, {})
        if request_id not in held:
            return
        if used is None:
            del held[request_id]
        else:
            held[request_id] = _Held(used, time.monotonic())


def _error(message: str) -> dict:
    return {"error": {"message": message, "type": "rate_limit_error", "param": None,
                      "code": "batch_tokens_per_day_exceeded"}}
