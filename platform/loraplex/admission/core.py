"""The limiter's pure logic: token buckets, concurrency slots, monthly budgets, Retry-After.

`LimiterCore` is the one shared state of a shard of tenants (the `LimiterActor` holds one).
Ingress replicas do not ask it per request: they take *leases*, slices of a tenant's
allowance (bucket tokens, concurrency slots, budget tokens) that they spend locally (see
lease.py). Every unit an ingress replica spends was granted here first, so the sum admitted
over all replicas never exceeds a limit; a slice held idle by one replica may make another
refuse early, for at most `lease_s`.

No I/O, no Ray, clock passed in: unit-testable and fast. Amounts are floats (tokens can be
refunded in part); negative give-backs are debts (a request that produced more than charged).
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Optional

from loraplex.accounting.period import month_bounds

WINDOW_S = 60.0  # requests_per_minute / tokens_per_minute: buckets that refill over one minute

# resource -> (TenantLimits field, the 429's error code)
RESOURCES: dict[str, tuple[str, str]] = {
    "requests": ("requests_per_minute", "rate_limit_requests"),
    "tokens": ("tokens_per_minute", "rate_limit_tokens"),
    "concurrency": ("max_concurrent_requests", "concurrency_limit"),
    "budget": ("monthly_token_budget", "budget_exceeded"),
}
ORDER = tuple(RESOURCES)  # the first refused resource names the 429

# A tenant's limits on one base model (TenantLimits.models) have their own state under the key
# "<tenant id>@<base model>", beside the tenant-wide state under the tenant id: a request on that
# base takes a lease of both. Tenant ids ("ten_<hex>") never contain "@".
BASE_SEPARATOR = "@"


def base_key(tenant: str, base_model: str) -> str:
    """The state key of `tenant`'s limits on `base_model`."""
    return f"{tenant}{BASE_SEPARATOR}{base_model}"


def split_key(key: str) -> tuple[str, Optional[str]]:
    """(tenant id, base model or None for the tenant-wide state)."""
    tenant, sep, base_model = key.partition(BASE_SEPARATOR)
    return tenant, (base_model if sep else None)


def on_base(key: str) -> str:
    """" on base model B" for a per-base key, "" for the tenant-wide one: refusals name the base."""
    base_model = split_key(key)[1]
    return f" on base model {base_model}" if base_model is not None else ""


def retry_after_s(deficit: float, rate_per_s: float) -> int:
    """Whole seconds until a bucket refilling at `rate_per_s` has `deficit` more; at least 1."""
    if deficit <= 0 or rate_per_s <= 0:
        return 1
    return max(1, math.ceil(deficit / rate_per_s - 1e-9))


def next_month_start(now: float) -> float:
    """Epoch seconds of the next UTC month (a monthly budget refills then)."""
    return month_bounds(datetime.fromtimestamp(now, timezone.utc))[1].timestamp()


def month_start(now: float) -> datetime:
    """The UTC month `now` (epoch seconds) falls in: the monthly budget's key."""
    return month_bounds(datetime.fromtimestamp(now, timezone.utc))[0]


def too_many_in_flight(limit: int, where: str = "") -> str:
    return (f"Too many requests in flight{where}: max_concurrent_requests is {limit}; "
            "retry when one of them has finished.")


def too_big(n: float, field_name: str, limit: int, where: str = "") -> str:
    return (f"This request needs {n:.0f} tokens (prompt + max_tokens), more than the tenant's {field_name}{where} "
            f"({limit}); lower max_tokens or shorten the prompt.")


class TokenBucket:
    """Holds up to `capacity` (the per-minute limit), refills at capacity / 60 per second."""

    __slots__ = ("capacity", "level", "stamp")

    def __init__(self, capacity: float, now: float):
        self.capacity = float(capacity)
        self.level = float(capacity)
        self.stamp = now

    @property
    def rate(self) -> float:
        return self.capacity / WINDOW_S

    def available(self, now: float) -> float:
        if now > self.stamp:
            self.level = min(self.capacity, self.level + (now - self.stamp) * self.rate)
            self.stamp = now
        return self.level

    def resize(self, capacity: float, now: float) -> None:
        """A changed limit keeps what was used in the window: the level moves by the change."""
        self.available(now)
        self.level = min(float(capacity), self.level + capacity - self.capacity)
        self.capacity = float(capacity)

    def take(self, n: float) -> None:
        self.level -= n

    def give(self, n: float, now: float) -> None:
        self.level = min(self.capacity, self.available(now) + n)


class Holders:
    """Units (concurrency slots, budget tokens) granted to ingress replicas and not given back.
    Per holder, so the units of a replica that died are dropped once it stops calling in."""

    __slots__ = ("units",)

    def __init__(self):
        self.units: dict[str, float] = {}

    def total(self) -> float:
        return sum(self.units.values())

    def add(self, holder: str, n: float) -> None:
        self.units[holder] = self.units.get(holder, 0.0) + n

    def drop(self, holders) -> None:
        for h in holders:
            self.units.pop(h, None)


@dataclass
class Budget:
    limit: float
    month: Optional[datetime] = None  # the month `settled` is for; None: never read
    settled: float = 0.0  # the ledger's month-to-date prompt + completion tokens, as last read
    read_at: float = float("-inf")  # clock time of that read
    unsettled: dict[str, tuple[float, float]] = field(default_factory=dict)  # request id -> (tokens, when)
    outstanding: Holders = field(default_factory=Holders)

    def used(self) -> float:
        return self.settled + sum(t for t, _ in self.unsettled.values()) + self.outstanding.total()


@dataclass
class TenantState:
    buckets: dict[str, TokenBucket] = field(default_factory=dict)  # requests, tokens
    slots: Optional[Holders] = None  # concurrency
    slot_limit: float = 0.0
    budget: Optional[Budget] = None


@dataclass
class Refusal:
    code: str
    retry_after: int
    message: str


class LimiterCore:
    """One shard's state. `acquire` grants at least `need` of every resource (else refuses, all
    or nothing) and up to `want`; `give_back` returns what a replica did not spend."""

    UNSETTLED_MAX_AGE_S = 300.0  # a record that never reached the ledger (unbilled) stops counting

    def __init__(self, holder_ttl_s: float = 30.0):
        self.epoch = uuid.uuid4().hex  # a new state: leases from an older one are void
        self.tenants: dict[str, TenantState] = {}
        self.holder_ttl_s = holder_ttl_s
        self.last_seen: dict[str, float] = {}
        self.grants: dict[str, dict[str, int]] = {}  # tenant -> holder -> acquires (for tests, stats)

    # -- state ------------------------------------------------------------------------------------
    def _state(self, tenant: str, limits: dict[str, int], now: float) -> TenantState:
        st = self.tenants.get(tenant)
        if st is None:
            st = self.tenants[tenant] = TenantState()
        for res in ("requests", "tokens"):
            limit = limits.get(res)
            bucket = st.buckets.get(res)
            if limit is None:
                st.buckets.pop(res, None)
            elif bucket is None:
                st.buckets[res] = TokenBucket(limit, now)
            elif bucket.capacity != limit:
                bucket.resize(limit, now)
        if "concurrency" in limits:
            st.slots = st.slots or Holders()
            st.slot_limit = limits["concurrency"]
        if "budget" in limits:
            if st.budget is None:
                st.budget = Budget(limits["budget"])
            st.budget.limit = limits["budget"]
        return st

    def budget_needs_read(self, tenant: str, now: float, max_age_s: float) -> bool:
        st = self.tenants.get(tenant)
        b = st.budget if st else None
        return b is None or b.month != month_start(now) or now - b.read_at > max_age_s

    def budget_read_never(self, tenant: str, now: float) -> bool:
        st = self.tenants.get(tenant)
        b = st.budget if st else None
        return b is None or b.month != month_start(now)

    def unsettled_ids(self, tenant: str) -> list[str]:
        st = self.tenants.get(tenant)
        return list(st.budget.unsettled) if st and st.budget else []

    def set_settled(self, tenant: str, month: datetime, total: float, in_ledger: set[str], now: float,
                    budget_limit: float) -> None:
        """The ledger's month-to-date total, read after `in_ledger` (the unsettled request ids it
        already had): those leave `unsettled`, so nothing is counted twice for long."""
        st = self.tenants.setdefault(tenant, TenantState())
        b = st.budget = st.budget or Budget(budget_limit)
        if b.month != month:
            b.unsettled = {k: v for k, v in b.unsettled.items() if v[1] >= month.timestamp()}
        b.month, b.settled, b.read_at = month, float(total), now
        for rid in in_ledger:
            b.unsettled.pop(rid, None)

    def _expire(self, st: TenantState, now: float) -> None:
        dead = [h for h, seen in self.last_seen.items() if now - seen > self.holder_ttl_s]
        if dead:
            if st.slots:
                st.slots.drop(dead)
            if st.budget:
                st.budget.outstanding.drop(dead)
        if st.budget:
            old = [k for k, (_, t) in st.budget.unsettled.items() if now - t > self.UNSETTLED_MAX_AGE_S]
            for k in old:
                del st.budget.unsettled[k]

    def touch(self, holder: str, now: float) -> None:
        self.last_seen[holder] = now

    # -- the two calls ----------------------------------------------------------------------------
    def acquire(self, tenant: str, holder: str, limits: dict[str, int], need: dict[str, float],
                want: dict[str, float], now: float, wall: float) -> dict | Refusal:
        """`limits`: resource -> limit (only the limits set). `now`: this process's monotonic
        clock; `wall`: epoch seconds (month boundaries)."""
        self.touch(holder, now)
        st = self._state(tenant, limits, now)
        self._expire(st, now)
        available = {}
        for res in ORDER:
            if res not in need:
                continue
            avail = self._available(st, res, now)
            if avail < need[res]:
                return self._refusal(st, res, need[res], limits, now, wall, on_base(tenant))
            available[res] = avail
        granted = {}
        for res, avail in available.items():
            n = min(max(want.get(res, need[res]), need[res]), max(avail, need[res]))
            if res in ("concurrency", "budget"):
                n = math.floor(n) if res == "concurrency" else n
            self._take(st, res, holder, n)
            granted[res] = n
        per = self.grants.setdefault(tenant, {})
        per[holder] = per.get(holder, 0) + 1
        return {"epoch": self.epoch, "granted": granted}

    def give_back(self, tenant: str, holder: str, epoch: str, returned: dict[str, float],
                  consumed: list[tuple[str, float]], now: float, wall: float) -> None:
        """`returned`: units granted and not spent (negative: spent more than granted).
        `consumed`: (request id, tokens) of finished requests, counted against the budget until
        the ledger has them."""
        self.touch(holder, now)
        if epoch != self.epoch:
            return  # granted by a state that was lost: nothing here to give back to
        st = self.tenants.get(tenant)
        if st is None:
            return
        for res, n in returned.items():
            if res in st.buckets:
                st.buckets[res].give(n, now)
            elif res == "concurrency" and st.slots is not None:
                st.slots.add(holder, -n)
            elif res == "budget" and st.budget is not None:
                st.budget.outstanding.add(holder, -n)
        if consumed and st.budget is not None:
            for rid, tokens in consumed:
                st.budget.outstanding.add(holder, -tokens)
                st.budget.unsettled[rid] = (tokens, wall)

    # -- per resource -----------------------------------------------------------------------------
    def _available(self, st: TenantState, res: str, now: float) -> float:
        if res in ("requests", "tokens"):
            return st.buckets[res].available(now)
        if res == "concurrency":
            return st.slot_limit - st.slots.total()
        return st.budget.limit - st.budget.used()

    def _take(self, st: TenantState, res: str, holder: str, n: float) -> None:
        if res in ("requests", "tokens"):
            st.buckets[res].take(n)
        elif res == "concurrency":
            st.slots.add(holder, n)
        else:
            st.budget.outstanding.add(holder, n)

    def _refusal(self, st: TenantState, res: str, n: float, limits: dict[str, int], now: float,
                 wall: float, where: str = "") -> Refusal:
        field_name, code = RESOURCES[res]
        limit = limits[res]
        if res in ("requests", "tokens"):
            bucket = st.buckets[res]
            unit = "requests" if res == "requests" else "tokens"
            if n > bucket.capacity:
                return Refusal(code, int(WINDOW_S), too_big(n, field_name, limit, where))
            wait = retry_after_s(n - bucket.available(now), bucket.rate)
            return Refusal(code, wait, f"Rate limit reached{where}: {field_name} is {limit} {unit}; "
                           f"retry in {wait} s.")
        if res == "concurrency":
            return Refusal(code, 1, too_many_in_flight(limit, where))
        b = st.budget
        if b.settled + sum(t for t, _ in b.unsettled.values()) + n > b.limit:
            wait = max(1, math.ceil(next_month_start(wall) - wall))
            return Refusal(code, wait, f"Monthly token budget exhausted{where}: monthly_token_budget is {limit} "
                           f"tokens and {b.settled + sum(t for t, _ in b.unsettled.values()):.0f} were used "
                           "this month (UTC); it renews on the 1st, or ask your administrator to raise it.")
        return Refusal(code, 1, f"Monthly token budget{where}: the requests in flight would exceed "
                       f"monthly_token_budget ({limit}); retry when one has finished.")

    def stats(self) -> dict:
        return {"epoch": self.epoch, "grants": {t: dict(h) for t, h in self.grants.items()}}
