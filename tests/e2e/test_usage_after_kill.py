"""kill -9 the engine replica while it holds unflushed usage records of replies already sent and
streams still running: every stream ends with an error event and `[DONE]` (never a hang or a
bare cut), each request is in the ledger exactly once (the finished ones replayed from the dead
replica's spool by its replacement, the cut streams as `engine_error` with exactly the tokens
their clients received), and the platform serves again."""

import json
import os
import secrets
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from sqlalchemy import func, select

from loraplex.accounting.ledger import UsageLedger
from loraplex.accounting.tables import usage_records
from loraplex.db.engine import make_engine

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_process import BASE_URL, StreamingChat, local_config, replica_pids, serve_run  # noqa: E402

from bench.tenants import new_tenant_key  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from waiting import wait_until  # noqa: E402

pytestmark = pytest.mark.e2e

ADMIN_TOKEN = secrets.token_urlsafe(16)


def readyz_details() -> httpx.Response:
    """/readyz with its details (the probe's replica): the public route answers the status alone."""
    return httpx.get(f"{BASE_URL}/admin/readyz", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=60)


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def rss(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


def alive(pid: int) -> bool:
    """Running, not a zombie waiting for its (dead) parent to reap it."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def descendants(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    children = [int(p) for p in out.split()]
    return children + [d for c in children for d in descendants(c)]


def test_records_survive_kill_9_exactly_once(tmp_path):
    # Nothing is flushed while serving: every record is only in the replica's spool when it dies.
    # Migration off (ingress.max_migrations 0): this test is about the ledger of streams that end
    # with the error event; tests/integration/test_migration.py moves them instead.
    config_path, db_url = local_config(tmp_path, accounting={"flush_interval_s": 3600}, ingress={"max_migrations": 0})

    with serve_run(str(config_path), tmp_path / "serve_run.log", ADMIN_TOKEN) as proc:
        key = new_tenant_key(BASE_URL, ADMIN_TOKEN, "crash")
        sent = {}
        with httpx.Client(base_url=BASE_URL, headers={"Authorization": f"Bearer {key}"}, timeout=120) as client:
            for i in range(6):
                body = {"model": "SmolLM2-135M-Instruct", "messages": [{"role": "user", "content": f"Say {i}."}],
                        "max_tokens": 3 + i, "temperature": 0}
                reply = client.post("/v1/chat/completions", json=body)
                assert reply.status_code == 200, reply.text
                sent[reply.headers["x-loraplex-request-id"]] = reply.json()["usage"]
        db = make_engine(db_url)
        with db.connect() as conn:
            assert conn.execute(select(func.count()).select_from(usage_records)).scalar() == 0

        # Three streams running on the replica when it dies.
        streams = [StreamingChat(key, i, 1500) for i in range(3)]
        for stream in streams:
            stream.start()
        wait_until(lambda: all(s.tokens >= 3 for s in streams) or any(s.failure for s in streams), 120,
                   "every stream's first tokens")
        assert all(s.tokens >= 3 for s in streams), [(s.tokens, s.failure) for s in streams]

        dead_replica = readyz_details().json()["probe"]["replica_id"]
        [pid] = replica_pids(proc, "Engine")
        engine_core = [c for c in descendants(pid) if "orphan_guard" not in cmdline(c)]
        assert engine_core, "vLLM's EngineCore should be a child of the Engine replica"
        core_memory = sum(rss(c) for c in engine_core)
        os.kill(pid, signal.SIGKILL)
        # vLLM's EngineCore does not watch its parent; the replica's orphan guard kills it, so
        # its memory is back for the replacement replica.
        wait_until(lambda: not any(alive(c) for c in engine_core), 30, f"EngineCore {engine_core} to die with its replica")
        assert core_memory > 100 << 20  # it held real memory (the model), now freed
        for stream in streams:
            stream.join(timeout=60)
            assert not stream.is_alive(), "a stream hung after its engine died"
            assert stream.failure is None, f"the stream was cut without an error event: {stream.failure!r}"
            error = json.loads(stream.events[-2].removeprefix("data: "))["error"]
            assert error["code"] == 503 and "lost" in error["message"]
            assert stream.events[-1] == "data: [DONE]"
        # Serve notices the dead actor and starts another replica, which replays the dead one's spool.
        wait_until(lambda: replica_pids(proc, "Engine") - {pid}, 300, "a replacement Engine replica process", interval_s=1)

        def ready_on_the_replacement():
            assert proc.poll() is None, f"`serve run` exited with {proc.returncode}"
            ready = readyz_details()
            return ready.status_code == 200 and ready.json()["probe"]["replica_id"] != dead_replica
        wait_until(ready_on_the_replacement, 600, "/readyz to answer 200 from the replacement replica", interval_s=2)

        def replayed():
            with db.connect() as conn:
                rows = {r.request_id: r for r in conn.execute(select(usage_records))}
            return rows if len(rows) >= len(sent) else None
        rows = wait_until(replayed, 60, "the dead replica's spooled records to be replayed", interval_s=1)
        assert set(rows) == set(sent)
        for request_id, usage in sent.items():
            assert rows[request_id].prompt_tokens == usage["prompt_tokens"]
            assert rows[request_id].completion_tokens == usage["completion_tokens"]
        # And the new replica serves and meters.
        with httpx.Client(base_url=BASE_URL, headers={"Authorization": f"Bearer {key}"}, timeout=120) as client:
            again = client.post("/v1/chat/completions", json={
                "model": "SmolLM2-135M-Instruct", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
        assert again.status_code == 200
    # The cut streams were billed by the ingress (its spool flushes at shutdown; replay whatever
    # a replica left unflushed, as a restarted one would).
    UsageLedger(db_url, str(tmp_path / "spool" / "replay"), adopt_orphans=True).recover()
    with db.connect() as conn:
        rows = {r.request_id: r for r in conn.execute(select(usage_records))}
    for stream in streams:
        row = rows[stream.request_id]
        assert row.status == "engine_error"
        assert row.completion_tokens == stream.tokens, (row.completion_tokens, stream.tokens)
    assert len(rows) == len(sent) + len(streams) + 1  # exactly once each, and the request after
