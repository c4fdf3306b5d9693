"""The operator's path on one real `serve run` of the shipped serve_config.yaml (its state in a
temp dir, the usage ledger flushed only at shutdown, stream migration off, a short batch lease),
then the crashes it must survive, in file order on that one platform (a `serve run` costs over a
minute here):

1. HTTP: curl-style and `openai` calls answer; bad requests get 4xx and the server keeps serving.
2. kill -9 of the Ingress replica whose runner is working a batch, mid-way: its replacement takes
   the batch over once the dead runner's lease runs out (`batches.lease_s`). Then kill -9 of the
   Engine replica serving its lines, while it holds unflushed usage records of replies already
   sent and streams still running: every stream ends with an error event and `[DONE]` (never a hang
   or a bare cut); the replacement replays the dead replica's spool and serves again; the lines it
   held come back to the runner as lost and are sent again. The batch completes, every input line
   in exactly one output line. (One Engine kill for both: a replacement costs most of a minute.)
3. The run stopped: each request and each batch line of 2 is in the ledger exactly once (the
   cut streams as `engine_error` with exactly the tokens their clients received, batch lines under
   `<batch id>-<line index>`, lines cut by either kill and sent again included).
"""

import json
import os
import secrets
import signal
import sys
from pathlib import Path

import httpx
import pytest
from openai import OpenAI, OpenAIError
from sqlalchemy import func, select

from loraplex.accounting.ledger import UsageLedger
from loraplex.accounting.tables import usage_records
from loraplex.batches.tables import batch_lines, batches
from loraplex.db.engine import make_engine

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_process import BASE_URL, RUN_MARK, StreamingChat, local_config, replica_pids, serve_run  # noqa: E402

from bench.processes import stop_marked  # noqa: E402
from bench.tenants import new_tenant_key  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from process_tree import alive, descendants  # noqa: E402
from waiting import wait_until  # noqa: E402

pytestmark = pytest.mark.e2e

ADMIN_TOKEN = secrets.token_urlsafe(16)
MODEL = "SmolLM2-135M-Instruct"
LINES, LINE_TOKENS = 16, 24
LEASE_S = 3.0  # the batch takeover's wait; the default (30 s) would only slow the test down
# What the crash tests leave for the ledger check after the run stops.
AFTER_STOP: dict = {}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(serve run process, database URL, state dir). Nothing is flushed while serving: a record is
    only in its replica's spool when the replica dies. Migration off (ingress.max_migrations 0):
    this file is about streams that end with the error event and batch lines sent again;
    tests/integration/test_migration.py moves streams instead."""
    tmp = tmp_path_factory.mktemp("serve")
    config_path, db_url = local_config(
        tmp, accounting={"flush_interval_s": 3600}, ingress={"max_migrations": 0},
        batches={"lease_s": LEASE_S, "poll_s": 0.5, "retry_s": 0.5, "lines_in_flight": 2})
    with serve_run(str(config_path), tmp / "serve_run.log", ADMIN_TOKEN) as proc:
        yield proc, db_url, tmp


@pytest.fixture(scope="module")
def api_key(served) -> str:
    return new_tenant_key(BASE_URL, ADMIN_TOKEN, f"e2e-{secrets.token_hex(4)}")


def test_curl_style_chat_answers_paris(served, api_key):
    response = httpx.post(
        f"{BASE_URL}/v1/chat/completions",
        headers={"Authorization": f"Bearer {api_key}"},
        json={
            "model": MODEL,
            "messages": [{"role": "user", "content": "What is the capital of France?"}],
            "max_tokens": 30,
            "temperature": 0,
        },
        timeout=120,
    )
    assert response.status_code == 200, response.text
    assert "Paris" in response.json()["choices"][0]["message"]["content"]


def test_openai_client_streams_from_serve_run(served, api_key):
    client = OpenAI(base_url=f"{BASE_URL}/v1", api_key=api_key, timeout=120)
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=30,
        temperature=0,
        stream=True,
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert "Paris" in text


def test_bad_request_then_still_serving(served, api_key):
    assert httpx.post(f"{BASE_URL}/v1/chat/completions", content=b"{}", timeout=30).status_code == 401
    auth = {"Authorization": f"Bearer {api_key}"}
    bad = httpx.post(f"{BASE_URL}/v1/chat/completions", content=b"{oops", headers=auth, timeout=30)
    assert bad.status_code == 400 and bad.json()["error"]["code"] == 400
    assert httpx.get(f"{BASE_URL}/readyz", timeout=60).status_code == 200


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


def test_a_batch_streams_and_records_survive_kill_9_of_the_ingress_then_the_engine(served):
    proc, db_url, _ = served
    db = make_engine(db_url)
    key = new_tenant_key(BASE_URL, ADMIN_TOKEN, "crash")
    sent = {}
    with httpx.Client(base_url=BASE_URL, headers={"Authorization": f"Bearer {key}"}, timeout=120) as client:
        for i in range(6):
            body = {"model": MODEL, "messages": [{"role": "user", "content": f"Say {i}."}],
                    "max_tokens": 3 + i, "temperature": 0}
            reply = client.post("/v1/chat/completions", json=body)
            assert reply.status_code == 200, reply.text
            sent[reply.headers["x-loraplex-request-id"]] = reply.json()["usage"]
    with db.connect() as conn:
        assert conn.execute(select(func.count()).select_from(usage_records)).scalar() == 0

    # The Ingress replica whose runner works the batch, killed mid-way.
    sdk = OpenAI(base_url=f"{BASE_URL}/v1", api_key=new_tenant_key(BASE_URL, ADMIN_TOKEN, "batch-crash"),
                 max_retries=0, timeout=30)
    lines = [{"custom_id": f"q{i}", "method": "POST", "url": "/v1/chat/completions",
              "body": {"model": MODEL, "max_tokens": LINE_TOKENS, "ignore_eos": True,
                       "temperature": 0, "messages": [{"role": "user", "content": f"Count to {i}."}]}}
             for i in range(LINES)]
    upload = sdk.files.create(file=("in.jsonl", "\n".join(map(json.dumps, lines)).encode()), purpose="batch")
    batch = sdk.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h")
    [ingress] = replica_pids(proc, "Ingress")

    def some_lines_done():
        now = sdk.batches.retrieve(batch.id)
        return now.request_counts.completed >= 2 or now.status in ("completed", "failed")
    wait_until(some_lines_done, 300, "the batch's first lines", interval_s=0.05)
    os.kill(ingress, signal.SIGKILL)

    with db.connect() as conn:
        row = conn.execute(select(batches).where(batches.c.id == batch.id)).mappings().one()
        pending = conn.execute(select(batch_lines.c.line_index).where(
            batch_lines.c.batch_id == batch.id, batch_lines.c.state == "pending")).scalars().all()
    assert row["status"] == "in_progress" and pending, "the batch ended before the kill: make its lines longer"
    assert row["lease_owner"] is not None  # the killed replica's runner held it, and can never release it now

    wait_until(lambda: replica_pids(proc, "Ingress") - {ingress}, 120, "a replacement Ingress replica", interval_s=1)

    # The replacement's runner has taken the batch over and runs its lines: now the Engine replica,
    # which also holds three streams and, in its spool, the unflushed records of every reply so far.
    def resumed():
        try:
            now = sdk.batches.retrieve(batch.id)
        except OpenAIError:  # the replacement is not serving yet
            return False
        return now.request_counts.completed >= LINES - len(pending) + 2 or now.status != "in_progress"
    wait_until(resumed, 120, "the batch's lines to run again on the replacement Ingress", interval_s=0.05)
    streams = [StreamingChat(key, i, 1500) for i in range(3)]
    for stream in streams:
        stream.start()
    wait_until(lambda: all(s.tokens >= 3 for s in streams) or any(s.failure for s in streams), 120,
               "every stream's first tokens")
    assert all(s.tokens >= 3 for s in streams), [(s.tokens, s.failure) for s in streams]

    dead_replica = readyz_details().json()["probe"]["replica_id"]
    [engine] = replica_pids(proc, "Engine")
    engine_core = [c for c in descendants(engine) if "orphan_guard" not in cmdline(c)]
    assert engine_core, "vLLM's EngineCore should be a child of the Engine replica"
    core_memory = sum(rss(c) for c in engine_core)
    os.kill(engine, signal.SIGKILL)
    with db.connect() as conn:
        still = conn.execute(select(batches.c.status).where(batches.c.id == batch.id)).scalar()
    assert still == "in_progress", "the batch ended before the Engine kill: make its lines longer"
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
    wait_until(lambda: replica_pids(proc, "Engine") - {engine}, 300, "a replacement Engine replica process",
               interval_s=1)

    def ready_on_the_replacement():
        assert proc.poll() is None, f"`serve run` exited with {proc.returncode}"
        ready = readyz_details()
        return ready.status_code == 200 and ready.json()["probe"]["replica_id"] != dead_replica
    wait_until(ready_on_the_replacement, 600, "/readyz to answer 200 from the replacement replica", interval_s=2)

    def replayed():
        with db.connect() as conn:
            rows = {r.request_id: r for r in conn.execute(select(usage_records))}
        return rows if set(sent) <= set(rows) else None
    rows = wait_until(replayed, 60, "the dead replica's spooled records to be replayed", interval_s=1)
    for request_id, usage in sent.items():
        assert rows[request_id].prompt_tokens == usage["prompt_tokens"]
        assert rows[request_id].completion_tokens == usage["completion_tokens"]

    def ended():
        assert proc.poll() is None, f"`serve run` exited with {proc.returncode}"
        try:
            now = sdk.batches.retrieve(batch.id)
        except OpenAIError:  # the replacement is not serving yet
            return None
        return now if now.status in ("completed", "failed", "expired", "cancelled") else None
    # Without the takeover of an expired lease the batch would stay in_progress, held by the dead runner.
    batch = wait_until(ended, 300, "the batch to end on the replacement replicas", interval_s=0.5)
    assert batch.status == "completed", batch
    assert (batch.request_counts.total, batch.request_counts.completed, batch.request_counts.failed) == (LINES, LINES, 0)
    out = [json.loads(x) for x in sdk.files.content(batch.output_file_id).text.splitlines()]
    assert batch.error_file_id is None
    assert sorted(o["custom_id"] for o in out) == sorted(x["custom_id"] for x in lines)  # each exactly once
    for o in out:
        assert o["response"]["status_code"] == 200
        assert o["response"]["body"]["usage"]["completion_tokens"] == LINE_TOKENS

    # And the new replica serves and meters.
    with httpx.Client(base_url=BASE_URL, headers={"Authorization": f"Bearer {key}"}, timeout=120) as client:
        again = client.post("/v1/chat/completions", json={
            "model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    assert again.status_code == 200
    AFTER_STOP["crash"] = (rows[next(iter(sent))].tenant_id, sent, streams, again.headers["x-loraplex-request-id"])
    AFTER_STOP["batch"] = (batch.id, pending)


def test_after_the_run_stops_each_request_and_batch_line_is_in_the_ledger_exactly_once(served):
    proc, db_url, tmp = served
    assert set(AFTER_STOP) == {"crash", "batch"}, "an earlier test of this file failed"
    # The replicas flush their spools at shutdown; replay whatever one left unflushed, as a
    # restarted one would.
    stop_marked(proc, (RUN_MARK, proc.run_mark), grace_s=60, port=8000)
    UsageLedger(db_url, str(tmp / "spool" / "replay"), adopt_orphans=True).recover()
    db = make_engine(db_url)

    tenant_id, sent, streams, again = AFTER_STOP["crash"]
    with db.connect() as conn:
        rows = {r.request_id: r for r in conn.execute(select(usage_records).where(usage_records.c.tenant_id == tenant_id))}
    for stream in streams:  # billed by the ingress for what their clients received
        row = rows[stream.request_id]
        assert row.status == "engine_error"
        assert row.completion_tokens == stream.tokens, (row.completion_tokens, stream.tokens)
    assert set(rows) == set(sent) | {s.request_id for s in streams} | {again}  # exactly once each

    batch_id, pending = AFTER_STOP["batch"]
    with db.connect() as conn:
        lines = conn.execute(select(usage_records).where(usage_records.c.request_id.like(f"{batch_id}-%"))).all()
    assert sorted(r.request_id for r in lines) == sorted(f"{batch_id}-{i}" for i in range(LINES))  # once each
    assert all(r.batch for r in lines)
    # Lines recorded before the kill were never sent again: they were billed their full answer.
    for r in lines:
        if int(r.request_id.rsplit("-", 1)[1]) not in pending:
            assert r.completion_tokens == LINE_TOKENS, r
