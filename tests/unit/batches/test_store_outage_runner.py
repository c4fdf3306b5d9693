"""A batch whose input file is in the adapter store while the store is down (its reads answer
AdapterStoreUnavailable): the batch waits, no line fails, and it completes once the store is back.
The real runner and repository (SQLite), a fake store and engine."""

import asyncio
import json
from datetime import datetime, timezone

from loraplex.accounting.tables import MIGRATIONS as ACCOUNTING
from loraplex.batches.config import BatchConfig
from loraplex.batches.repository import BatchRepository
from loraplex.batches.results import LineResult
from loraplex.batches.runner import BatchRunner
from loraplex.batches.tables import MIGRATIONS as BATCHES
from loraplex.db.engine import make_engine
from loraplex.db.migrations import migrate
from loraplex.store_io import AdapterStoreUnavailable

CHAT = "/v1/chat/completions"


class FakeStoreFiles:
    """BatchFileStore's get/put over a dict; `down`: every call is what a bounded call to a dead store raises."""

    def __init__(self):
        self.data, self.down = {}, False

    def _check(self):
        if self.down:
            raise AdapterStoreUnavailable("s3://fake-store", "the file could not be read", timeout_s=1)

    def get(self, tenant, file_id):
        self._check()
        return self.data[(tenant, file_id)]

    def put(self, tenant, file_id, data):
        self._check()
        self.data[(tenant, file_id)] = data


def test_a_batch_waits_for_the_store_and_goes_on_when_it_is_back(tmp_path):
    db = make_engine(f"sqlite:///{tmp_path}/t.db")
    migrate(db, ACCOUNTING + BATCHES)
    repo = BatchRepository(db, lambda: datetime.now(timezone.utc))
    files, ran = FakeStoreFiles(), []

    async def execute(batch, line, request_id):
        ran.append(request_id)
        return LineResult(200, {"usage": {"prompt_tokens": 1, "completion_tokens": 1}})

    def new_runner():
        return BatchRunner(repo, files, BatchConfig(lines_in_flight=1, retry_s=0.01, poll_s=0.01), execute, owner="r1")
    runner = new_runner()
    text = "\n".join(json.dumps({"custom_id": f"c{i}", "method": "POST", "url": CHAT,
                                 "body": {"model": "m", "messages": [{"role": "user", "content": "x"}]}})
                     for i in range(3))
    files.put("acme", "file-in", text.encode())
    batch_id = repo.create_batch("acme", None, CHAT, "file-in", None, 24 * 3600)["id"]

    files.down = True

    async def passes_while_down():
        runner_task = asyncio.create_task(runner.run_forever())
        await asyncio.sleep(0.3)  # many polls against the dead store
        runner.stop()
        await runner_task
    asyncio.run(passes_while_down())
    waiting = repo.get_batch("acme", batch_id)
    assert waiting["status"] == "validating" and waiting["failed"] == 0 and ran == []

    files.down = False
    runner = new_runner()  # the first was stopped above

    async def drain():
        for _ in range(10):
            if not await runner.run_once() or repo.get_batch("acme", batch_id)["status"] == "completed":
                return
    asyncio.run(asyncio.wait_for(drain(), 10))
    done = repo.get_batch("acme", batch_id)
    assert done["status"] == "completed" and done["completed"] == 3 and done["failed"] == 0 and len(ran) == 3
    db.dispose()
