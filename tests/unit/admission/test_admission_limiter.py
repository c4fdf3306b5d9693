"""The ingress side: leases spent locally, refunds, release however a request ends, two
replicas sharing one state, fail open."""

import asyncio
from types import SimpleNamespace

import pytest

from loraplex.admission.config import LimiterConfig
from loraplex.admission.core import LimiterCore
from loraplex.admission.limiter import OPEN, LimitExceeded, Limiter, LimiterUnavailable, LocalBackend
from loraplex.contract import EngineCall, EngineChunk, EngineError
from loraplex.tenancy.models import TenantLimits


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def principal(**limits):
    return SimpleNamespace(tenant_id="ten_a", limits=TenantLimits(**limits))


def call(prompt=10, max_tokens=20, rid="r"):
    return EngineCall(request_id=rid, tenant_id="ten_a", prompt_tokens=prompt, max_tokens=max_tokens)


def run(coro):
    return asyncio.run(coro)


async def stream(*items):
    for item in items:
        yield item


async def drain(admission, *items):
    async for _ in admission.track(stream(*items)):
        pass


def setup(n=1, clock=None, **cfg):
    clock = clock or Clock()
    backend = LocalBackend(LimiterCore(), clock=clock)
    cfg = LimiterConfig(**cfg)
    return backend, [Limiter(backend, cfg, holder=f"r{i}", clock=clock) for i in range(n)], clock


def test_unlimited_tenant_costs_no_round_trip():
    backend, (lim,), _ = setup()

    async def go():
        assert await lim.admit(principal(priority=5), call()) is OPEN
        assert await lim.admit(None, call()) is OPEN

    run(go())
    assert backend.calls == 0 and not lim.leases


def test_slices_are_spent_locally():
    backend, (lim,), _ = setup(slice_fraction=0.1)

    async def go():
        for i in range(10):
            await drain(await lim.admit(principal(requests_per_minute=100), call(rid=str(i))),
                        EngineChunk(b"x", 5, 0, 3))

    run(go())
    assert backend.calls == 1  # one slice of 10 requests


def test_requests_limit_429_names_it_with_retry_after():
    _, (lim,), _ = setup()

    async def go():
        for i in range(3):
            await drain(await lim.admit(principal(requests_per_minute=3), call(rid=str(i))), EngineChunk(b"x", 5, 0, 3))
        with pytest.raises(LimitExceeded) as e:
            await lim.admit(principal(requests_per_minute=3), call())
        return e.value

    exc = run(go())
    assert exc.status == 429 and exc.code == "rate_limit_requests" and exc.headers["Retry-After"] == "20"
    assert exc.body()["error"]["type"] == "rate_limit_error"
    assert exc.reject_reason == "429:rate_limit_requests"


def test_tokens_charged_prompt_plus_max_tokens_and_refunded_at_the_end():
    backend, (lim,), _ = setup()
    p = principal(tokens_per_minute=100)

    async def go():
        a = await lim.admit(p, call(prompt=10, max_tokens=80))  # 90 charged
        with pytest.raises(LimitExceeded) as e:
            await lim.admit(p, call(prompt=10, max_tokens=80))
        assert e.value.code == "rate_limit_tokens" and e.value.headers["Retry-After"] == "48"  # 80 missing
        await drain(a, EngineChunk(b"x", 12, 0, 3))  # used 15: 75 back, 85 left in the minute
        with pytest.raises(LimitExceeded):
            await lim.admit(p, call(prompt=10, max_tokens=80))
        await lim.admit(p, call(prompt=10, max_tokens=75))

    run(go())


def test_default_cap_is_charged_without_max_tokens_and_overuse_is_a_debt():
    _, (lim,), _ = setup(default_max_tokens=50)
    p = principal(tokens_per_minute=100)

    async def go():
        await drain(await lim.admit(p, call(prompt=0, max_tokens=None)), EngineChunk(b"x", 10, 0, 85))  # 95 used
        await asyncio.sleep(0)  # the debt goes to the shared state at once (fire and forget)
        with pytest.raises(LimitExceeded):
            await lim.admit(p, call(prompt=0, max_tokens=10))

    run(go())


@pytest.mark.parametrize("ending", ["finished", "engine_refused", "billed_error", "disconnect", "raised"])
def test_concurrency_released_however_the_request_ends(ending):
    _, (lim,), _ = setup()
    p = principal(max_concurrent_requests=1, tokens_per_minute=1000)

    async def go():
        a = await lim.admit(p, call())
        with pytest.raises(LimitExceeded) as e:
            await lim.admit(p, call())
        assert e.value.code == "concurrency_limit" and e.value.headers["Retry-After"] == "1"
        if ending == "finished":
            await drain(a, EngineChunk(b"x", 10, 0, 5))
        elif ending == "engine_refused":
            await drain(a, EngineError(400, "too long"))
        elif ending == "billed_error":
            await drain(a, EngineError(500, "boom", billed=True))
        elif ending == "disconnect":  # Starlette cancels the body generator: aclose() mid-stream
            items = a.track(stream(EngineChunk(b"x", 10, 0, 1), EngineChunk(b"y", 10, 0, 2)))
            await anext(items)
            await items.aclose()
        else:
            a.release()
            a.release()  # idempotent
        await lim.admit(p, call())  # the slot is back
        lease = lim.leases["ten_a"]
        return lease

    lease = run(go())
    # A slice of 50 tokens, 30 charged per request; what came back depends on how it ended:
    # used 15 -> 15 back; refused before generating -> all; billed without counts -> none
    # (another slice then); cut after 1 token -> 19 back.
    expected = {"finished": 5, "engine_refused": 20, "billed_error": 40, "disconnect": 9, "raised": 20}[ending]
    assert lease.credit["tokens"] == expected


def test_two_replicas_never_admit_more_than_the_limit_together():
    backend, lims, _ = setup(n=2, slice_fraction=0.5)
    p = principal(requests_per_minute=10)

    async def go():
        admitted = 0
        for i in range(40):
            try:
                await drain(await lims[i % 2].admit(p, call(rid=str(i))), EngineChunk(b"x", 1, 0, 1))
                admitted += 1
            except LimitExceeded:
                pass
        return admitted

    assert run(go()) == 10


class SlowBackend(LocalBackend):
    """Answers after the event loop has run the other callers: a burst's acquires all in flight."""

    async def acquire(self, *args):
        await asyncio.sleep(0.01)
        return await super().acquire(*args)


@pytest.mark.parametrize("limit,burst", [(64, 24), (16, 16)])
def test_a_burst_under_the_concurrency_limit_is_admitted_whole(limit, burst):
    """Each of a burst's first requests leases a slice (5% of 64: 4 slots) before any grant lands:
    16 grants spend the shared 64 and the 17th is refused, though the lease holds 48 spare."""
    clock = Clock()
    lim = Limiter(SlowBackend(LimiterCore(), clock=clock), LimiterConfig(), holder="r0", clock=clock)
    p = principal(max_concurrent_requests=limit)

    async def go():
        results = await asyncio.gather(*(lim.admit(p, call(rid=str(i))) for i in range(burst)),
                                       return_exceptions=True)
        refused = [r for r in results if isinstance(r, BaseException)]
        over = await asyncio.gather(lim.admit(p, call(rid="over")), return_exceptions=True) if burst == limit else []
        return refused, over

    refused, over = run(go())
    assert refused == []
    assert all(isinstance(r, LimitExceeded) and r.code == "concurrency_limit" for r in over)  # the limit still holds


def test_idle_slices_go_back_after_lease_s_so_the_other_replica_can_use_them():
    backend, (a, b), clock = setup(n=2, slice_fraction=1.0, lease_s=1.0)
    p = principal(max_concurrent_requests=2)

    async def go():
        await drain(await a.admit(p, call()), EngineChunk(b"x", 1, 0, 1))  # a leased both slots
        with pytest.raises(LimitExceeded):
            await b.admit(p, call())
        clock.t += 1.0
        a.sweep()
        await asyncio.sleep(0)
        await b.admit(p, call())

    run(go())


def test_a_patched_limit_takes_effect_at_once_despite_a_held_slice():
    _, (lim,), _ = setup(slice_fraction=0.5)

    async def go():
        await drain(await lim.admit(principal(requests_per_minute=100), call()), EngineChunk(b"x", 1, 0, 1))
        assert lim.leases["ten_a"].credit["requests"] == 49  # a slice held locally
        with pytest.raises(LimitExceeded):  # lowered to 1, of which 1 was used in this window
            await lim.admit(principal(requests_per_minute=1), call())

    run(go())


def test_budget_consumption_reported_and_in_flight_counted():
    backend, (lim,), clock = setup()
    p = principal(monthly_token_budget=100)

    async def go():
        a = await lim.admit(p, call(prompt=10, max_tokens=40))  # 50 in flight
        await drain(await lim.admit(p, call(prompt=10, max_tokens=30, rid="r2")), EngineChunk(b"x", 10, 0, 30))
        with pytest.raises(LimitExceeded) as e:
            await lim.admit(p, call(prompt=10, max_tokens=40))
        assert e.value.code == "budget_exceeded"
        await drain(a, EngineChunk(b"x", 10, 0, 5))
        clock.t += 0.1
        lim.sweep()
        await asyncio.sleep(0)
        assert backend.core.tenants["ten_a"].budget.unsettled.keys() == {"r", "r2"}
        await lim.admit(p, call(prompt=5, max_tokens=40))  # 55 used + 45 = 100

    run(go())


@pytest.mark.parametrize("mode", ["open", "closed"])
def test_limiter_unreachable_fails_open_or_closed(mode):
    backend, (lim,), _ = setup(on_unavailable=mode)
    backend.down = True

    async def go():
        return await lim.admit(principal(requests_per_minute=1), call())

    if mode == "open":
        assert run(go()) is OPEN
    else:
        with pytest.raises(LimiterUnavailable) as e:
            run(go())
        assert e.value.status == 503 and e.value.headers["Retry-After"] == "1"


def test_state_lost_is_rebuilt_empty_and_old_leases_are_void():
    backend, (lim,), _ = setup()
    p = principal(requests_per_minute=1)

    async def go():
        await drain(await lim.admit(p, call()), EngineChunk(b"x", 1, 0, 1))
        with pytest.raises(LimitExceeded):
            await lim.admit(p, call())
        backend.core = LimiterCore()  # the actor died and was recreated empty
        await drain(await lim.admit(p, call()), EngineChunk(b"x", 1, 0, 1))
        with pytest.raises(LimitExceeded):
            await lim.admit(p, call())

    run(go())
