"""What an ingress replica gives back reaches the shared state before it asks again: asked
first, the state still counts the returned units as the replica's and refuses (a PATCHed
tenant's one concurrency slot, an idle slice swept back). The give-back here takes a round
trip, as it does over Ray."""

import asyncio
from types import SimpleNamespace

import pytest

from loraplex.admission.config import LimiterConfig
from loraplex.admission.core import LimiterCore
from loraplex.admission.limiter import LimitExceeded, Limiter, LocalBackend
from loraplex.contract import EngineCall, EngineChunk
from loraplex.tenancy.models import TenantLimits


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


class RoundTripBackend(LocalBackend):
    """A give-back applied only after a few turns of the event loop, like a remote call's answer."""

    def __init__(self, clock, turns=5):
        super().__init__(LimiterCore(), clock=clock)
        self.turns = turns

    async def give_back(self, *args):
        for _ in range(self.turns):
            await asyncio.sleep(0)
        await super().give_back(*args)


def principal(**limits):
    return SimpleNamespace(tenant_id="ten_a", limits=TenantLimits(**limits))


def call(rid):
    return EngineCall(request_id=rid, tenant_id="ten_a", prompt_tokens=10, max_tokens=20)


async def finished(admission):
    async def one_chunk():
        yield EngineChunk(b"x", 10, 0, 5)

    async for _ in admission.track(one_chunk()):
        pass


def test_after_a_patch_the_old_leases_slot_is_back_before_the_next_admission_asks():
    clock = Clock()
    limiter = Limiter(RoundTripBackend(clock), LimiterConfig(), holder="r0", clock=clock)

    async def go():
        before = principal(max_concurrent_requests=1, requests_per_minute=1)
        await finished(await limiter.admit(before, call("r1")))
        with pytest.raises(LimitExceeded) as refused:
            await limiter.admit(before, call("r2"))
        assert refused.value.code == "rate_limit_requests"
        # PATCH requests_per_minute to null: nothing is in flight, so the one slot is free.
        await finished(await limiter.admit(principal(max_concurrent_requests=1), call("r3")))

    asyncio.run(go())


def test_an_idle_slice_swept_back_is_back_before_the_next_admission_asks():
    clock = Clock()
    limiter = Limiter(RoundTripBackend(clock), LimiterConfig(lease_s=1.0), holder="r0", clock=clock)
    p = principal(max_concurrent_requests=1)

    async def go():
        await finished(await limiter.admit(p, call("r1")))  # the slot stays leased here, unused
        clock.t += 1.0
        limiter.sweep()  # idle for lease_s: the slot goes back
        await finished(await limiter.admit(p, call("r2")))

    asyncio.run(go())


def test_a_give_back_that_never_lands_delays_an_admission_at_most_acquire_timeout_s():
    clock = Clock()
    backend = RoundTripBackend(clock)
    limiter = Limiter(backend, LimiterConfig(acquire_timeout_s=0.05), holder="r0", clock=clock)
    never = asyncio.Event()

    async def lost(*args):
        await never.wait()

    async def go():
        await finished(await limiter.admit(principal(max_concurrent_requests=2), call("r1")))
        backend.give_back = lost
        loop = asyncio.get_running_loop()
        start = loop.time()
        # PATCHed: the old lease's give-back hangs; the admission asks after the timeout (one
        # slot is still counted as ours, the other is free)
        await finished(await limiter.admit(principal(max_concurrent_requests=2, requests_per_minute=5), call("r2")))
        assert 0.04 <= loop.time() - start < 1.0
        assert not limiter._returning  # not waited for again

    asyncio.run(go())
