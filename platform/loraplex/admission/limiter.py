"""Limiter: the ingress side of tenant limits.

Per request: `admission = await limiter.admit(principal, call)` (raises `LimitExceeded`, a 429),
then the engine stream goes through `admission.track(...)`, whose end (finished, disconnect,
error, deadline) releases the concurrency slot and refunds the tokens that were charged and not
generated. Tenants without any limit cost nothing: no lease, no round trip. A tenant's limits on
the request's base model (TenantLimits.models) are a second lease, under the key
"<tenant>@<base>" (core.base_key), taken and released with the tenant-wide one.

Allowance is leased from the shared `LimiterCore` (a Ray actor per shard, or in-process) in
slices and spent here, so most admissions are a few dict operations; see core.py for exactness.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Optional

from loraplex.admission.config import LimiterConfig
from loraplex.admission.core import (
    ORDER, RESOURCES, WINDOW_S, LimiterCore, Refusal, base_key, on_base, too_big, too_many_in_flight,
)
from loraplex.contract import EngineChunk, EngineError
from loraplex.errors import StatusError

logger = logging.getLogger(__name__)

HEARTBEAT_S = 5.0  # a replica holding slots calls in at least this often (the core drops silent holders)


class LimitExceeded(StatusError):
    """429 with Retry-After; `code` names the limit. Counted as a refusal `429:<code>`."""

    status = 429

    def __init__(self, code: str, retry_after: int, message: str):
        super().__init__(message, code=code, headers={"Retry-After": str(max(1, int(retry_after)))},
                         reject_reason=f"429:{code}")


class LimiterUnavailable(StatusError):
    """on_unavailable: closed, and the limiter cannot be reached."""

    status = 503

    def __init__(self):
        super().__init__("Admission control is unavailable; retry shortly.", code="limiter_unavailable",
                         headers={"Retry-After": "1"}, reject_reason="503:limiter_unavailable")


class BackendUnavailable(Exception):
    pass


def limit_values(limits) -> dict[str, int]:
    """resource -> limit, for the limits that are set."""
    out = {}
    for res, (name, _) in RESOURCES.items():
        value = getattr(limits, name, None)
        if value is not None:
            out[res] = value
    return out


@dataclass
class Lease:
    """What this replica holds of one tenant's allowance, under the limits it was granted for."""

    limits: dict[str, int]
    epoch: Optional[str] = None
    credit: dict[str, float] = field(default_factory=dict)
    consumed: list = field(default_factory=list)  # (request id, tokens): for the budget
    last_used: float = 0.0
    in_flight: int = 0
    slots: float = 0.0  # concurrency units the admissions in flight here hold (a request: its sequences)
    last_call: float = 0.0


class Admission:
    """One admitted request: release it exactly once, however it ends."""

    __slots__ = ("limiter", "tenant", "lease", "amounts", "charge", "request_id", "last", "billed", "released",
                 "linked")

    def __init__(self, limiter, tenant, lease, amounts, charge, request_id):
        self.limiter, self.tenant, self.lease, self.amounts = limiter, tenant, lease, amounts
        self.charge, self.request_id = charge, request_id
        self.last: Optional[EngineChunk] = None
        self.billed = False  # the engine billed a failure we have no counts for: keep the charge
        self.released = False
        self.linked: Optional[Admission] = None  # the same request's admission on its base's limits

    async def track(self, items: AsyncIterator) -> AsyncIterator:
        """Pass the engine stream through, keeping the last counts; release when it ends."""
        try:
            async for item in items:
                if isinstance(item, EngineChunk):
                    self.last = item
                    if item.final:  # metered: free the slot before the client sees the end
                        self.release()
                elif isinstance(item, EngineError) and item.billed:
                    self.billed = True
                yield item
        finally:
            self.release()
            aclose = getattr(items, "aclose", None)
            if aclose is not None:
                await aclose()

    def used_tokens(self) -> Optional[float]:
        """Tokens the request really used; None: it never reached the engine (refund all)."""
        if self.last is not None:
            return float(self.last.prompt_tokens + self.last.completion_tokens)
        return float(self.charge) if self.billed else None

    def release(self) -> None:
        if self.released:
            return
        self.released = True
        if self.limiter is not None:
            self.limiter._release(self)
        if self.linked is not None:  # the base's lease settles on the same counts
            self.linked.last, self.linked.billed = self.last, self.billed
            self.linked.release()


OPEN = Admission(None, None, None, {}, 0, None)  # unlimited tenant, or failed open: nothing to release
OPEN.released = True


class Limiter:
    def __init__(self, backend, config: LimiterConfig | None = None, holder: str | None = None, clock=time.monotonic):
        self.backend = backend
        self.config = config or LimiterConfig()
        self.holder = holder or uuid.uuid4().hex
        self.clock = clock
        self.leases: dict[str, Lease] = {}
        self.failed_open = 0
        self._sweeper: Optional[asyncio.Task] = None
        self._tasks: set[asyncio.Task] = set()
        self._returning: dict[str, set[asyncio.Task]] = {}  # tenant -> its give-back calls not yet answered
        self._acquiring: dict[str, set[asyncio.Future]] = {}  # tenant -> its acquire calls not yet answered

    # -- the request path -------------------------------------------------------------------------
    async def hold(self, principal) -> Admission:
        """One concurrency slot for a request whose body is still to be read: a tenant's open
        connections count against its max_concurrent_requests, so a slow body holds its own
        tenant's slot, not every tenant's ingress. `admit(principal, call, held=...)` takes it
        over; release it if the request ends before that. OPEN without a concurrency limit."""
        if principal is None:
            return OPEN
        limits = limit_values(principal.limits)
        if "concurrency" not in limits:
            return OPEN
        lease = self.leases.get(principal.tenant_id)
        if lease is not None and lease.limits == limits and lease.slots >= limits["concurrency"]:
            # Every slot is held by requests on this replica: refused without a round trip (a
            # flood of connections costs the shared state nothing).
            raise LimitExceeded("concurrency_limit", 1, too_many_in_flight(limits["concurrency"]))
        self._ensure_sweeper()
        return await self._acquire(principal.tenant_id, limits, {"concurrency": 1}, 0, None)

    async def admit(self, principal, call, held: Admission = None, resources: tuple[str, ...] | None = None) -> Admission:
        """Admit `call`, counting its sequences (n x prompts): each holds a concurrency slot and
        is charged its max_tokens, the prompts once. `held`: this request's slot from hold().
        `resources`: only these of the tenant's limits apply (a batch line: the budget alone);
        the lease stays the tenant's one, under all its limits. A request on a base the tenant
        has limits on (`call.base_model`) must fit those too: refused by either, it takes nothing."""
        held = held if held is not None else OPEN
        if principal is None:
            return OPEN
        base = getattr(call, "base_model", None)
        per_base = limit_values(principal.limits.for_base(base)) if base is not None else {}
        base_admission = OPEN
        if per_base:  # first: refused here, the tenant-wide lease is not touched
            base_admission = await self._admit(base_key(principal.tenant_id, base), per_base, call, OPEN, resources)
        try:
            tenant_wide = await self._admit(principal.tenant_id, limit_values(principal.limits), call, held, resources)
        except BaseException:
            base_admission.release()  # never reached the engine: all of it goes back
            raise
        if base_admission is OPEN or tenant_wide is OPEN:
            return tenant_wide if base_admission is OPEN else base_admission
        tenant_wide.linked = base_admission
        return tenant_wide

    def charge(self, call) -> int:
        """The tokens an admission holds for `call` until it ends: its prompts once, and each
        sequence (n x prompts) its max_tokens (default_max_tokens where it has none)."""
        sequences = max(getattr(call, "sequences", 1), 1)
        return call.prompt_tokens + sequences * (call.max_tokens or self.config.default_max_tokens)

    async def _admit(self, key: str, limits: dict, call, held: Admission, resources) -> Admission:
        """admit() against one state: the tenant-wide one (`key` the tenant id) or one base's."""
        applied = [r for r in limits if resources is None or r in resources]
        if not applied:
            return OPEN  # no limit: no lease, no round trip
        self._ensure_sweeper()
        sequences = max(getattr(call, "sequences", 1), 1)
        charge = self.charge(call)
        amounts = {res: (charge if res in ("tokens", "budget") else sequences if res == "concurrency" else 1)
                   for res in applied}
        where = on_base(key)
        if "tokens" in amounts and charge > limits["tokens"]:  # can never fit the bucket: say so, no round trip
            raise LimitExceeded("rate_limit_tokens", int(WINDOW_S),
                                too_big(charge, "tokens_per_minute", limits["tokens"], where))
        if "concurrency" in amounts and sequences > limits["concurrency"]:  # can never start: the ingress refuses it first
            raise LimitExceeded("concurrency_limit", 1, f"This request runs {sequences} sequences (n x prompts), "
                                f"more than max_concurrent_requests{where} ({limits['concurrency']}); send fewer.")
        return await self._acquire(key, limits, amounts, charge, call.request_id, held)

    async def _acquire(self, tenant: str, limits: dict, amounts: dict, charge: float, request_id,
                       held: Admission = OPEN) -> Admission:
        """Spend `amounts` from the tenant's lease, leasing more from the shared state as needed.
        `held`'s units count towards them if it is on the same lease (else it is released)."""
        for attempt in range(3):
            lease, need = self._shortfall(tenant, limits, amounts, held)
            while need and self._returning.get(tenant):
                # Asked before our give-backs land, the shared state still counts the units they
                # return as ours (after a PATCH: the old lease's one concurrency slot) and refuses.
                await self._returned(tenant)
                lease, need = self._shortfall(tenant, limits, amounts, held)
            if not need:
                break
            want = {r: max(n, math.ceil(limits[r] * self.config.slice_fraction)) for r, n in need.items()}
            try:
                result = await self._ask(tenant, self.backend.acquire(tenant, self.holder, limits, need, want))
            except BackendUnavailable as exc:
                held.release()
                return self._unavailable(tenant, exc)
            if result is None:
                held.release()
                return self._unavailable(tenant, "timed out")
            if "unavailable" in result:  # on_unavailable: closed, and the actor cannot read the budget
                held.release()
                return self._unavailable(tenant, result["unavailable"])
            if "refused" in result:
                if attempt < 2:
                    # A burst's acquires each lease a slice: the shared state may be spent by grants
                    # that landed here meanwhile, or are still on their way, with units to spare.
                    others = set(self._acquiring.get(tenant, ()))
                    if others:
                        await asyncio.wait(others)
                    if others or not self._shortfall(tenant, limits, amounts, held)[1]:
                        continue  # look again
                raise LimitExceeded(result["refused"], result["retry_after"], result["message"])
            current = self.leases.get(tenant)
            if current is not lease or (lease.epoch is not None and lease.epoch != result["epoch"]):
                # The lease changed while we waited (a PATCH or a new limiter state): the grant
                # belongs to the new state; start a lease for it and try again.
                lease = self.leases[tenant] = Lease(limits, epoch=result["epoch"])
            lease.epoch = result["epoch"]
            for r, n in result["granted"].items():
                lease.credit[r] = lease.credit.get(r, 0.0) + n
        else:
            raise LimitExceeded(self._first_code(limits), 1, "Too many requests at once for this tenant; retry.")
        owned = held.amounts if (not held.released and held.lease is lease) else {}
        for r, a in amounts.items():
            lease.credit[r] -= a - owned.get(r, 0)
        lease.slots += amounts.get("concurrency", 0) - owned.get("concurrency", 0)
        if owned:  # its units are the new admission's now
            held.released = True
        else:
            held.release()
            lease.in_flight += 1
        lease.last_used = self.clock()
        return Admission(self, tenant, lease, amounts, charge, request_id)

    async def _ask(self, tenant: str, acquire) -> Any:
        """Await the shared state's answer to `acquire`, counted among the tenant's calls in flight."""
        call = asyncio.ensure_future(acquire)
        pending = self._acquiring.setdefault(tenant, set())
        pending.add(call)
        try:
            return await call
        finally:
            pending.discard(call)
            if not pending:
                self._acquiring.pop(tenant, None)

    def _shortfall(self, tenant: str, limits: dict, amounts: dict, held: Admission) -> tuple[Lease, dict]:
        """The tenant's lease under `limits` and what it lacks of `amounts` (`held`'s units count
        if they are on it). A lease granted under other limits (a PATCH) goes back first."""
        lease = self.leases.get(tenant)
        if lease is None or lease.limits != limits:
            if lease is not None:
                self._give_back(tenant, lease)
            lease = self.leases[tenant] = Lease(limits)
        owned = held.amounts if (not held.released and held.lease is lease) else {}
        need = {r: a - owned.get(r, 0) - lease.credit.get(r, 0.0) for r, a in amounts.items()
                if lease.credit.get(r, 0.0) < a - owned.get(r, 0)}
        return lease, need

    def _release(self, adm: Admission) -> None:
        lease = adm.lease
        lease.in_flight -= 1
        lease.last_used = self.clock()
        used = adm.used_tokens()
        for res, amount in adm.amounts.items():
            if res == "concurrency":
                lease.credit[res] = lease.credit.get(res, 0.0) + amount
                lease.slots -= amount
            elif res == "requests":
                if used is None:  # never reached the engine: it does not count
                    lease.credit[res] = lease.credit.get(res, 0.0) + 1
            else:  # tokens, budget: refund what was not used (negative: used more than charged)
                lease.credit[res] = lease.credit.get(res, 0.0) + amount - (used or 0.0)
        if "budget" in adm.amounts and used:
            lease.consumed.append((adm.request_id, used))
        debts = {r: n for r, n in lease.credit.items() if n < 0}
        if debts and lease.epoch is not None:  # used more than charged: tell the shared state now
            for r in debts:
                lease.credit[r] = 0.0
            self._send_back(adm.tenant, self.backend.give_back(adm.tenant, self.holder, lease.epoch, debts, []))

    def _unavailable(self, tenant: str, why: Any) -> Admission:
        self.failed_open += 1
        if self.failed_open == 1 or self.failed_open % 100 == 0:
            logger.warning("limiter unavailable (%s): %s tenant %s (%d so far)", why,
                           "admitting" if self.config.on_unavailable == "open" else "refusing", tenant, self.failed_open)
        if self.config.on_unavailable == "closed":
            raise LimiterUnavailable()
        return OPEN

    @staticmethod
    def _first_code(limits: dict) -> str:
        return next(RESOURCES[r][1] for r in ORDER if r in limits)

    # -- leases going back --------------------------------------------------------------------
    def _give_back(self, tenant: str, lease: Lease) -> None:
        returned = {r: n for r, n in lease.credit.items() if n}
        consumed, lease.consumed = lease.consumed, []
        lease.credit = {}
        if lease.epoch is None or not (returned or consumed):
            return
        lease.last_call = self.clock()
        self._send_back(tenant, self.backend.give_back(tenant, self.holder, lease.epoch, returned, consumed))

    def _send_back(self, tenant: str, give_back) -> None:
        """Run the `give_back` call in the background; the tenant's next acquire waits for it."""
        task = self._spawn(give_back)
        if task is not None:
            self._returning.setdefault(tenant, set()).add(task)
            task.add_done_callback(lambda done: self._landed(tenant, done))

    def _landed(self, tenant: str, task: asyncio.Task) -> None:
        pending = self._returning.get(tenant)
        if pending is not None:
            pending.discard(task)
            if not pending:
                del self._returning[tenant]

    async def _returned(self, tenant: str) -> None:
        """Wait until the shared state has what this replica gave back of `tenant`. At most
        acquire_timeout_s: a give-back that is later than that (the actor is slow or gone) is
        not waited for again, and the acquire that follows meets the same actor anyway."""
        pending = set(self._returning.get(tenant, ()))
        if pending:
            _, late = await asyncio.wait(pending, timeout=self.config.acquire_timeout_s)
            for task in late:
                self._landed(tenant, task)

    def sweep(self) -> None:
        """Give back what sat unused for lease_s, report budget consumption, call in."""
        now = self.clock()
        for tenant, lease in list(self.leases.items()):
            idle = now - lease.last_used >= self.config.lease_s
            if idle and any(lease.credit.values()):
                self._give_back(tenant, lease)
            elif lease.consumed:
                consumed, lease.consumed = lease.consumed, []
                lease.last_call = now
                self._send_back(tenant, self.backend.give_back(tenant, self.holder, lease.epoch, {}, consumed))
            elif lease.in_flight and now - lease.last_call > HEARTBEAT_S:
                lease.last_call = now
                self._spawn(self.backend.touch(tenant, self.holder))
            if idle and lease.in_flight == 0 and not any(lease.credit.values()) and not lease.consumed:
                del self.leases[tenant]

    def close(self) -> None:
        """Give everything back (a replica going away)."""
        for tenant, lease in list(self.leases.items()):
            self._give_back(tenant, lease)
        if self._sweeper is not None:
            self._sweeper.cancel()

    def _ensure_sweeper(self) -> None:
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep_loop())

    async def _sweep_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.lease_s / 2)
            try:
                self.sweep()
            except Exception:
                logger.exception("limiter sweep failed")

    def _spawn(self, coro) -> Optional[asyncio.Task]:
        try:
            task = asyncio.get_running_loop().create_task(coro)
        except RuntimeError:  # no loop (interpreter shutdown): the lease expires in the shared state
            coro.close()
            return None
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task


# -- backends: where the shared state lives --------------------------------------------------------
class LocalBackend:
    """The shared state in this process: for one replica, tests and the benchmark."""

    def __init__(self, core: LimiterCore | None = None, clock=time.monotonic, wall=time.time):
        self.core = core or LimiterCore()
        self.clock, self.wall = clock, wall
        self.calls = 0
        self.down = False

    async def acquire(self, tenant, holder, limits, need, want):
        self.calls += 1
        if self.down:
            raise BackendUnavailable("down")
        result = self.core.acquire(tenant, holder, limits, need, want, self.clock(), self.wall())
        if isinstance(result, Refusal):
            return {"epoch": self.core.epoch, "refused": result.code, "retry_after": result.retry_after,
                    "message": result.message}
        return result

    async def give_back(self, tenant, holder, epoch, returned, consumed):
        if not self.down:
            self.core.give_back(tenant, holder, epoch, returned, consumed, self.clock(), self.wall())

    async def touch(self, tenant, holder):
        if not self.down:
            self.core.touch(holder, self.clock())
