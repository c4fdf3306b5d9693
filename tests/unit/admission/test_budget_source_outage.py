"""The budget source (the ledger's month-to-date usage) when the database is down: the actor
counts the failed read, retries after budget_cache_s, and `on_unavailable` decides: open (the
default) goes on from the last read, or admits a never-read tenant; closed makes the ingress
refuse that tenant with 503 + Retry-After until a read succeeds. Real LimiterActor (no Ray),
real Limiter, the ledger on SQLite; the outage is tests/db_outage.py."""

import asyncio
import sys
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace

import pytest

from db_outage import outage
from loraplex.accounting.ledger import UsageLedger
from loraplex.admission.actor import LimiterActor
from loraplex.admission.config import LimiterConfig
from loraplex.admission.limiter import Limiter, LimiterUnavailable
from loraplex.db.engine import make_engine
from loraplex.tenancy.models import TenantLimits

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "accounting"))
from usage_builders import make_record  # noqa: E402


class Counter:
    def __init__(self):
        self.value = 0.0

    def inc(self, n, tags=None):
        self.value += n

    def zero(self, tags=None):
        pass


class Sink:
    def __init__(self):
        self.counters = {}

    def make(self, spec):
        return self.counters.setdefault(spec.name, Counter())


class ActorBackend:
    """The Limiter's backend interface straight onto a LimiterActor (what RayBackend does over Ray)."""

    def __init__(self, actor):
        self.actor = actor

    async def acquire(self, tenant, holder, limits, need, want):
        return await self.actor.acquire(tenant, holder, limits, need, want)

    async def give_back(self, *args):
        pass

    async def touch(self, *args):
        pass


@pytest.fixture
def ledgered(tmp_path):
    """A database whose ledger holds 120 tokens of t1 this month."""
    url = f"sqlite:///{tmp_path}/db.sqlite"
    db = make_engine(url)
    with UsageLedger(engine=db, spool_dir=str(tmp_path / "spool")) as ledger:
        now = datetime.now(timezone.utc)
        ledger.append(make_record(1, at=now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)))
        ledger.flush()
    yield url
    db.dispose()


def actor_for(url, on_unavailable="open"):
    sink = Sink()
    actor = LimiterActor(url, budget_cache_s=0.05, on_unavailable=on_unavailable, metrics_sink=sink)
    return actor, sink.counters["loraplex_budget_source_failures_total"]


def admit(limiter, tokens):
    principal = SimpleNamespace(tenant_id="t1", limits=TenantLimits(monthly_token_budget=200))
    call = SimpleNamespace(prompt_tokens=tokens - 1, max_tokens=1, request_id=f"r{tokens}")  # charges `tokens`
    return limiter.admit(principal, call)


def test_open_goes_on_from_the_last_read_and_counts_the_failure(ledgered):
    actor, failures = actor_for(ledgered)
    limiter = Limiter(ActorBackend(actor), LimiterConfig(slice_fraction=0.01, default_max_tokens=1))

    async def go():
        (await admit(limiter, 30)).release()  # first read: 120 used
        await asyncio.sleep(0.1)  # the read is now older than budget_cache_s
        with outage(actor._db):
            admitted = await admit(limiter, 60)  # 120 + 60 <= 200, from the last read
            await asyncio.sleep(0.01)  # the background re-read fails
            with pytest.raises(Exception) as over:  # the last read still binds: 120 + 90 > 200
                await admit(limiter, 90)
            admitted.release()
        return over.value

    over = asyncio.run(go())
    assert getattr(over, "code", None) == "budget_exceeded"
    assert failures.value >= 1 and "t1" in actor.failed_at


def test_open_admits_a_tenant_never_read_this_month(ledgered):
    actor, failures = actor_for(ledgered)
    actor._db = make_engine(ledgered)
    limiter = Limiter(ActorBackend(actor), LimiterConfig(default_max_tokens=1))

    async def go():
        with outage(actor._db):
            return await admit(limiter, 190)  # the ledger's 120 are unknown: not enforced meanwhile

    assert asyncio.run(go()).amounts["budget"] == 190
    assert failures.value == 1


def test_closed_refuses_with_503_until_a_read_succeeds(ledgered):
    actor, failures = actor_for(ledgered, "closed")
    actor._db = make_engine(ledgered)
    limiter = Limiter(ActorBackend(actor), LimiterConfig(default_max_tokens=1, on_unavailable="closed"))

    async def go():
        with outage(actor._db):
            with pytest.raises(LimiterUnavailable) as refused:
                await admit(limiter, 10)
        await asyncio.sleep(0.1)  # past budget_cache_s: the next admission reads again, and it works
        return refused.value, await admit(limiter, 10)

    refused, admitted = asyncio.run(go())
    assert refused.status == 503 and refused.headers["Retry-After"]
    assert admitted.amounts["budget"] == 10 and "t1" not in actor.failed_at
    assert failures.value == 1


def test_a_failed_read_is_retried_after_budget_cache_s_not_per_admission(ledgered):
    calls = []

    def failing(db, tenant, month, ids, base_model=None):
        calls.append(tenant)
        raise ConnectionError("down")

    actor = LimiterActor(ledgered, budget_cache_s=0.2, budget_source=failing, metrics_sink=Sink())

    async def go():
        for _ in range(20):
            await actor.acquire("t1", "r0", {"budget": 200}, {"budget": 1}, {"budget": 1})
        await asyncio.sleep(0.25)
        await actor.acquire("t1", "r0", {"budget": 200}, {"budget": 1}, {"budget": 1})

    asyncio.run(go())
    assert len(calls) == 2
