"""Admission counts sequences (n x prompts) and holds a slot before the body is read (issue 34)."""

import asyncio
from types import SimpleNamespace

import pytest

from loraplex.admission.config import LimiterConfig
from loraplex.admission.core import LimiterCore
from loraplex.admission.limiter import OPEN, LimitExceeded, Limiter, LocalBackend
from loraplex.contract import EngineCall
from loraplex.tenancy.models import TenantLimits


def principal(**limits):
    return SimpleNamespace(tenant_id="ten_a", limits=TenantLimits(**limits))


def call(sequences=1, prompt=10, max_tokens=20, rid="r"):
    return EngineCall(request_id=rid, tenant_id="ten_a", prompt_tokens=prompt, max_tokens=max_tokens,
                      sequences=sequences)


def limiter():
    return Limiter(LocalBackend(LimiterCore()), LimiterConfig(slice_fraction=0.01))


def test_a_request_holds_one_concurrency_slot_per_sequence():
    lim = limiter()

    async def go():
        p = principal(max_concurrent_requests=4)
        wide = await lim.admit(p, call(sequences=3, rid="wide"))
        with pytest.raises(LimitExceeded) as e:
            await lim.admit(p, call(sequences=2, rid="two"))  # 3 + 2 > 4
        assert e.value.code == "concurrency_limit"
        one = await lim.admit(p, call(rid="one"))
        wide.release()
        again = await lim.admit(p, call(sequences=3, rid="again"))  # wide's 3 came back
        one.release(), again.release()
    asyncio.run(go())


def test_the_charge_is_the_prompt_plus_every_sequences_max_tokens():
    lim = limiter()

    async def go():
        p = principal(tokens_per_minute=1000)
        with pytest.raises(LimitExceeded) as e:
            await lim.admit(p, call(sequences=4, prompt=10, max_tokens=300))  # 10 + 4 x 300 = 1210
        assert e.value.code == "rate_limit_tokens" and "1210 tokens" in e.value.message
        ok = await lim.admit(p, call(sequences=3, prompt=10, max_tokens=300))  # 910 fits
        assert ok.charge == 910
        ok.release()
    asyncio.run(go())


def test_a_slot_held_before_the_body_is_taken_over_by_the_admission():
    lim = limiter()

    async def go():
        p = principal(max_concurrent_requests=3)
        held = [await lim.hold(p) for _ in range(3)]  # three bodies still arriving: the tenant's 3 slots
        with pytest.raises(LimitExceeded) as e:
            await lim.hold(p)  # a fourth connection is refused before its body is read
        assert e.value.code == "concurrency_limit"
        # The first body arrived: its admission takes over its slot (no second one needed).
        admitted = await lim.admit(p, call(rid="first"), held[0])
        assert held[0].released and lim.leases["ten_a"].in_flight == 3
        for h in held[1:]:  # the others timed out (408): their slots come back
            h.release()
        wide = await lim.admit(p, call(sequences=2, rid="wide"))
        admitted.release(), wide.release()
        assert lim.leases["ten_a"].in_flight == 0
        assert lim.leases["ten_a"].credit["concurrency"] == pytest.approx(3.0)
    asyncio.run(go())


def test_holding_costs_nothing_without_a_concurrency_limit():
    lim = limiter()

    async def go():
        assert await lim.hold(principal(tokens_per_minute=100)) is OPEN
        assert await lim.hold(None) is OPEN
    asyncio.run(go())


def test_a_connection_flood_past_the_slots_held_here_costs_no_round_trip():
    backend = LocalBackend(LimiterCore())
    lim = Limiter(backend, LimiterConfig(slice_fraction=0.01))

    async def go():
        p = principal(max_concurrent_requests=3)
        held = [await lim.hold(p) for _ in range(3)]
        calls = backend.calls
        for _ in range(50):
            with pytest.raises(LimitExceeded) as e:
                await lim.hold(p)
            assert e.value.code == "concurrency_limit" and "max_concurrent_requests is 3" in e.value.message
        assert backend.calls == calls  # refused here: every slot is this replica's
        held[0].release()
        again = await lim.hold(p)  # a slot came back: admitted again
        for h in (again, *held[1:]):
            h.release()
        assert lim.leases["ten_a"].slots == 0
    asyncio.run(go())
