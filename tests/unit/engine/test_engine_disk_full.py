"""An Engine replica's disks full: a ledger holding accounting.max_unspooled_records (its spool's
disk full, the database unreachable) refuses new billable requests with 503 usage_spool_full,
unrun and unbilled, and serves again once the records are taken; an adapter cache with no room
answers 503 adapter_cache_full naming it, unbilled."""
import errno
import sys
from pathlib import Path

from loraplex.contract import EngineChunk, EngineError
from loraplex.disk_full import CacheDiskFull
from test_engine_replica import ADAPTER, Script, chat, drain, ledger_rows, llm, make_call, replica  # noqa: F401 (fixture)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "accounting"))
from usage_builders import make_record  # noqa: E402


async def test_a_replica_whose_ledger_is_full_refuses_naming_the_spool_then_serves_when_it_drains(replica):
    ledger = replica.ledger
    real_append = ledger.spool.append

    def disk_full(entry, fresh_line=False):
        raise OSError(errno.ENOSPC, "No space left on device")
    ledger.spool.append, ledger.max_unspooled = disk_full, 1
    ledger.append(make_record(1))  # held: the replica's limit reached
    [refused] = await drain(replica.generate(make_call("req-refused"), chat()))
    assert isinstance(refused, EngineError) and refused.status == 503 and refused.billed is False
    assert (refused.reason, refused.code, refused.retry_after) == ("usage_spool_full", "usage_spool_full", 10)
    assert str(ledger.spool.dir) in refused.message and replica.engine.chat_serving.requests == []
    ledger.flush()  # the database takes the held record: the replica serves again
    ledger.spool.append = real_append
    llm(replica).script = Script(prompt_len=5, cached=0, tokens=3)
    served = await drain(replica.generate(make_call("req-served"), chat()))
    assert all(isinstance(c, EngineChunk) for c in served)
    assert [r["request_id"] for r in ledger_rows(replica)] == ["req-served", "req-t1-1"]


async def test_an_adapter_cache_with_no_room_is_an_unbilled_503_naming_it(replica):
    store = replica.engine.adapters.store

    def full(tenant, sha256):
        raise CacheDiskFull("/var/adapter-cache", OSError(errno.ENOSPC, "No space left on device"))
    store.fetch_to_local_cache = full
    [refused] = await drain(replica.generate(make_call("req-cache-full", adapter=ADAPTER), chat(model="bot@2")))
    assert isinstance(refused, EngineError) and refused.status == 503 and refused.billed is False
    assert (refused.reason, refused.code, refused.retry_after) == ("adapter_cache_full", "adapter_cache_full", 10)
    assert "/var/adapter-cache" in refused.message and ledger_rows(replica) == []
