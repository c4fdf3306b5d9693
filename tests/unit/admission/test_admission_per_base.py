"""A tenant's limits on one base model (TenantLimits.models, issue 35): on top of the tenant-wide
ones, a second lease under "<tenant>@<base>"; refused by either, a request takes nothing; both
are released however it ends; a per-base budget counts that base's tokens only."""

import asyncio
import sys
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace

import pytest

from loraplex.accounting.ledger import UsageLedger
from loraplex.admission.actor import LimiterActor
from loraplex.admission.budget_source import month_to_date
from loraplex.admission.config import LimiterConfig
from loraplex.admission.core import LimiterCore, base_key, split_key
from loraplex.admission.limiter import LimitExceeded, Limiter, LocalBackend
from loraplex.contract import EngineCall, EngineChunk
from loraplex.db.engine import make_engine
from loraplex.tenancy.models import TenantLimits

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "accounting"))
from usage_builders import make_record  # noqa: E402

A, B = "small", "tiny"


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def principal(**limits):
    return SimpleNamespace(tenant_id="ten_a", limits=TenantLimits(**limits))


def call(base, prompt=10, max_tokens=20, rid="r"):
    return EngineCall(request_id=rid, tenant_id="ten_a", prompt_tokens=prompt, max_tokens=max_tokens, base_model=base)


async def stream(*items):
    for item in items:
        yield item


async def drain(admission, *items):
    async for _ in admission.track(stream(*items)):
        pass


def setup(**cfg):
    clock = Clock()
    backend = LocalBackend(LimiterCore(), clock=clock)
    return backend, Limiter(backend, LimiterConfig(**cfg), holder="r0", clock=clock), clock


def done(used=10):
    """The last chunk of a request that used `used` tokens (5 of them its prompt)."""
    return EngineChunk(b"x", 5, 0, used - 5)


def test_a_per_base_rate_refuses_on_that_base_and_names_it_while_the_other_base_serves():
    _, lim, _ = setup()
    p = principal(models={B: {"requests_per_minute": 2}})

    async def go():
        for i in range(2):
            await drain(await lim.admit(p, call(B, rid=f"b{i}")), done())
        with pytest.raises(LimitExceeded) as e:
            await lim.admit(p, call(B))
        for i in range(5):  # the other base has no limit of its own
            await drain(await lim.admit(p, call(A, rid=f"a{i}")), done())
        return e.value

    exc = asyncio.run(go())
    assert exc.status == 429 and exc.code == "rate_limit_requests" and exc.headers["Retry-After"] == "30"
    assert f"on base model {B}" in exc.body()["error"]["message"]


def test_the_tenant_wide_limit_still_binds_across_bases():
    _, lim, _ = setup()
    p = principal(requests_per_minute=3, models={A: {"requests_per_minute": 10}, B: {"requests_per_minute": 10}})

    async def go():
        for i, base in enumerate((A, B, A)):
            await drain(await lim.admit(p, call(base, rid=str(i))), done())
        with pytest.raises(LimitExceeded) as e:
            await lim.admit(p, call(B))
        return e.value

    exc = asyncio.run(go())
    assert exc.code == "rate_limit_requests" and "on base model" not in exc.body()["error"]["message"]


def test_a_request_the_tenant_wide_limit_refuses_takes_nothing_of_its_bases():
    _, lim, _ = setup()
    p = principal(max_concurrent_requests=1, models={A: {"requests_per_minute": 1}})

    async def go():
        on_b = await lim.admit(p, call(B, rid="b"))  # holds the tenant's one slot
        with pytest.raises(LimitExceeded) as e:
            await lim.admit(p, call(A, rid="a1"))
        assert e.value.code == "concurrency_limit"
        await drain(on_b, done())
        await drain(await lim.admit(p, call(A, rid="a2")), done())  # A's one request was given back

    asyncio.run(go())


@pytest.mark.parametrize("ending", ["finished", "released"])
def test_both_leases_are_released_however_the_request_ends(ending):
    _, lim, _ = setup()
    p = principal(max_concurrent_requests=1, models={A: {"max_concurrent_requests": 1}})

    async def go():
        first = await lim.admit(p, call(A))
        with pytest.raises(LimitExceeded) as e:
            await lim.admit(p, call(A))
        assert e.value.code == "concurrency_limit" and f"on base model {A}" in e.value.body()["error"]["message"]
        if ending == "finished":
            await drain(first, done())
        else:
            first.release()
        await lim.admit(p, call(A))  # both slots back: the base's and the tenant's

    asyncio.run(go())
    assert lim.leases[base_key("ten_a", A)].slots == 1 and lim.leases["ten_a"].slots == 1


def test_the_base_lease_refunds_what_the_request_did_not_use():
    _, lim, _ = setup()
    p = principal(tokens_per_minute=1000, models={A: {"tokens_per_minute": 100}})  # the base's settles with the tenant's

    async def go():
        first = await lim.admit(p, call(A, prompt=10, max_tokens=80))  # 90 charged
        with pytest.raises(LimitExceeded):
            await lim.admit(p, call(A, prompt=10, max_tokens=10))
        await drain(first, done(15))  # 15 used: 75 back, 85 left in the minute
        with pytest.raises(LimitExceeded):
            await lim.admit(p, call(A, prompt=10, max_tokens=76))
        await lim.admit(p, call(A, prompt=10, max_tokens=75))

    asyncio.run(go())


def test_a_per_base_budget_counts_that_base_only():
    backend, lim, clock = setup()
    p = principal(monthly_token_budget=1000, models={A: {"monthly_token_budget": 100}})

    async def go():
        await drain(await lim.admit(p, call(A, prompt=10, max_tokens=60, rid="a1")), done(60))
        with pytest.raises(LimitExceeded) as e:
            await lim.admit(p, call(A, prompt=10, max_tokens=40, rid="a2"))  # 60 + 50 > 100
        for i in range(3):  # B spends from the tenant's budget alone
            await drain(await lim.admit(p, call(B, prompt=10, max_tokens=100, rid=f"b{i}")), done(100))
        clock.t += 0.1
        lim.sweep()
        await asyncio.sleep(0)
        return e.value

    exc = asyncio.run(go())
    assert exc.code == "budget_exceeded" and f"on base model {A}" in exc.body()["error"]["message"]
    assert backend.core.tenants[base_key("ten_a", A)].budget.unsettled.keys() == {"a1"}
    assert backend.core.tenants["ten_a"].budget.unsettled.keys() == {"a1", "b0", "b1", "b2"}


def test_a_batch_line_meets_its_bases_budget_not_its_rate():
    _, lim, _ = setup()
    p = principal(models={A: {"requests_per_minute": 1, "monthly_token_budget": 50}})

    async def go():
        for i in range(2):  # a rate does not apply to batch lines
            await drain(await lim.admit(p, call(A, prompt=5, max_tokens=10, rid=str(i)), resources=("budget",)), done())
        with pytest.raises(LimitExceeded) as e:
            await lim.admit(p, call(A, prompt=5, max_tokens=40), resources=("budget",))
        return e.value

    assert asyncio.run(go()).code == "budget_exceeded"


def test_the_actor_reads_a_per_base_budget_from_that_bases_records():
    reads = []

    def source(db, tenant_id, month, ids, base_model=None):
        reads.append((tenant_id, base_model))
        return {None: 0.0, A: 90.0}[base_model], set()

    actor = LimiterActor("sqlite://", budget_cache_s=60, budget_source=source, metrics_sink=_NoSink())

    async def go():
        await actor.acquire("ten_a", "r0", {"budget": 100}, {"budget": 20}, {"budget": 20})
        return await actor.acquire(base_key("ten_a", A), "r0", {"budget": 100}, {"budget": 20}, {"budget": 20})

    refused = asyncio.run(go())
    assert reads == [("ten_a", None), ("ten_a", A)]
    assert refused["refused"] == "budget_exceeded" and f"on base model {A}" in refused["message"]


def test_keys_split_back_into_tenant_and_base():
    assert split_key(base_key("ten_a", "org/model-1")) == ("ten_a", "org/model-1")
    assert split_key("ten_a") == ("ten_a", None)


class _NoSink:
    def make(self, spec):
        return SimpleNamespace(zero=lambda: None, inc=lambda n: None)


def test_month_to_date_of_one_base(db_url, tmp_path):
    db = make_engine(db_url)
    with UsageLedger(engine=db, spool_dir=str(tmp_path / "spool")) as ledger:
        ledger.append(make_record(1, base_model=A))  # 100 + 20
        ledger.append(make_record(2, base_model=B, completion_tokens=30))
        ledger.flush()
    nov = datetime(2026, 11, 1, tzinfo=timezone.utc)
    assert month_to_date(db, "t1", nov, [], A)[0] == 120
    assert month_to_date(db, "t1", nov, [], B)[0] == 130
    assert month_to_date(db, "t1", nov, [])[0] == 250
    db.dispose()
