"""batch_tokens_per_day over the real runner, repository and ledger query (SQLite), a fake clock
and a fake engine that bills each line into usage_records: at the limit the batch parks (still
in_progress, no line failed) until the next UTC day and then goes on; another tenant's batch is not
held back; a batch whose window ends while parked expires its remaining lines."""

import asyncio
import json
from datetime import datetime, timedelta, timezone

import pytest

from loraplex.accounting.tables import MIGRATIONS as ACCOUNTING
from loraplex.accounting.tables import usage_records
from loraplex.batches.config import BatchConfig
from loraplex.batches.day_tokens import BatchDayTokens
from loraplex.batches.repository import BatchRepository
from loraplex.batches.runner import BatchRunner
from loraplex.batches.tables import MIGRATIONS as BATCHES
from loraplex.batches.results import LineResult
from loraplex.db.engine import make_engine
from loraplex.db.migrations import migrate

CHAT = "/v1/chat/completions"
LINE_TOKENS = 4  # each line's prompt + max_tokens estimate, and what it really uses


class Clock:
    def __init__(self, now):
        self.now = now

    def __call__(self):
        return self.now


class Files:
    def __init__(self):
        self.data = {}

    def get(self, tenant, file_id):
        return self.data[(tenant, file_id)]

    def put(self, tenant, file_id, data):
        self.data[(tenant, file_id)] = data


class Engine:
    """BatchLines' use of the gate, over an engine that bills every line LINE_TOKENS."""

    def __init__(self, db, clock, limits):
        self.db, self.clock, self.limits = db, clock, limits
        self.gate = BatchDayTokens(db, clock)
        self.ran: list[tuple[str, datetime]] = []

    async def __call__(self, batch, line, request_id):
        tenant = batch["tenant_id"]
        refused = await self.gate.take(tenant, self.limits.get(tenant), request_id, LINE_TOKENS)
        if refused is not None:
            return refused
        self.ran.append((request_id, self.clock()))
        with self.db.begin() as conn:
            conn.execute(usage_records.insert().values(
                request_id=request_id, tenant_id=tenant, base_model="base", prompt_tokens=2, cached_prompt_tokens=0,
                completion_tokens=2, status="ok", arrival_time=self.clock(), finish_time=self.clock(), batch=True))
        self.gate.settle(tenant, request_id, LINE_TOKENS)
        return LineResult(200, {"usage": {"prompt_tokens": 2, "completion_tokens": 2}})


@pytest.fixture
def world(tmp_path):
    db = make_engine(f"sqlite:///{tmp_path}/t.db")
    migrate(db, ACCOUNTING + BATCHES)
    clock = Clock(datetime(2026, 3, 1, 20, 0, tzinfo=timezone.utc))
    repo, files = BatchRepository(db, clock), Files()
    limits = {"acme": 10}  # two lines a day
    engine = Engine(db, clock, limits)
    runner = BatchRunner(repo, files, BatchConfig(lines_in_flight=1, retry_s=0.01, poll_s=0.01), engine, owner="r1")
    yield db, clock, repo, files, engine, runner
    db.dispose()


def make_batch(repo, files, tenant, n, window_s=24 * 3600):
    text = "\n".join(json.dumps({"custom_id": f"c{i}", "method": "POST", "url": CHAT,
                                 "body": {"model": "m", "messages": [{"role": "user", "content": "x"}]}})
                     for i in range(n))
    files.put(tenant, f"file-{tenant}", text.encode())
    return repo.create_batch(tenant, None, CHAT, f"file-{tenant}", None, window_s)["id"]


def drain(runner):
    """Run passes until nothing is claimable now (a batch that never parks would loop: a timeout)."""
    async def go():
        while await runner.run_once():
            pass
    asyncio.run(asyncio.wait_for(go(), 10))


def test_at_the_limit_the_batch_parks_until_the_next_utc_day_then_goes_on(world):
    db, clock, repo, files, engine, runner = world
    batch_id = make_batch(repo, files, "acme", 5, window_s=4 * 24 * 3600)
    drain(runner)
    parked = repo.get_batch("acme", batch_id)
    assert parked["status"] == "in_progress" and parked["completed"] == 2 and parked["failed"] == 0
    assert parked["not_before"] == datetime(2026, 3, 2, tzinfo=timezone.utc)
    clock.now = datetime(2026, 3, 1, 23, 59, 59, tzinfo=timezone.utc)
    assert repo.claim("another-runner", 30) is None  # still today: no runner takes it
    drain(runner)
    assert len(engine.ran) == 2
    clock.now = datetime(2026, 3, 2, 0, 0, 1, tzinfo=timezone.utc)
    drain(runner)
    assert repo.get_batch("acme", batch_id)["completed"] == 4
    clock.now = datetime(2026, 3, 3, 0, 0, 1, tzinfo=timezone.utc)
    drain(runner)
    done = repo.get_batch("acme", batch_id)
    assert done["status"] == "completed" and done["completed"] == 5 and done["failed"] == 0
    per_day = {}
    for _, at in engine.ran:
        per_day[at.date()] = per_day.get(at.date(), 0) + LINE_TOKENS
    assert max(per_day.values()) <= 10 and len(per_day) == 3


def test_another_tenants_batch_is_not_held_back(world):
    db, clock, repo, files, engine, runner = world
    held = make_batch(repo, files, "acme", 5)
    free = make_batch(repo, files, "globex", 5)  # no batch_tokens_per_day
    drain(runner)
    assert repo.get_batch("acme", held)["status"] == "in_progress"
    other = repo.get_batch("globex", free)
    assert other["status"] == "completed" and other["completed"] == 5


def test_a_batch_whose_window_ends_while_parked_expires_its_remaining_lines(world):
    db, clock, repo, files, engine, runner = world
    batch_id = make_batch(repo, files, "acme", 5, window_s=3600)  # ends 21:00, before the next day
    drain(runner)
    assert repo.get_batch("acme", batch_id)["status"] == "in_progress"
    clock.now += timedelta(seconds=3601)
    drain(runner)
    ended = repo.get_batch("acme", batch_id)
    assert ended["status"] == "expired" and ended["completed"] == 2 and ended["failed"] == 3
    errors = [json.loads(x) for x in files.get("acme", ended["error_file_id"]).decode().splitlines()]
    assert [e["error"]["code"] for e in errors] == ["batch_expired"] * 3


def test_a_parked_batch_cancelled_is_cancelled_now_not_the_next_day(world):
    db, clock, repo, files, engine, runner = world
    batch_id = make_batch(repo, files, "acme", 5)
    drain(runner)
    assert repo.cancel("acme", batch_id)["status"] == "cancelling"
    clock.now += timedelta(seconds=1)  # still today
    drain(runner)
    ended = repo.get_batch("acme", batch_id)
    assert ended["status"] == "cancelled" and ended["completed"] == 2 and ended["failed"] == 3
