"""kill -9 the Ingress replica whose runner is working a batch, mid-way: its replacement takes the
batch over once the dead runner's lease runs out (`batches.lease_s`); then kill -9 the Engine
replica serving its lines: the lines it held come back to the runner as lost and are sent again to
the replacement. The batch completes, every input line ends in exactly one output or error line,
and each line is in the ledger exactly once under its request id `<batch id>-<line index>` (lines
cut by either kill and sent again included)."""

import json
import os
import secrets
import signal
import sys
from pathlib import Path

import pytest
from openai import OpenAI, OpenAIError
from sqlalchemy import select

from loraplex.accounting.tables import usage_records
from loraplex.batches.tables import batch_lines, batches
from loraplex.db.engine import make_engine

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_process import BASE_URL, local_config, replica_pids, serve_run  # noqa: E402

from bench.tenants import new_tenant_key  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from waiting import wait_until  # noqa: E402

pytestmark = pytest.mark.e2e

ADMIN_TOKEN = secrets.token_urlsafe(16)
LINES, MAX_TOKENS = 16, 24
LEASE_S = 3.0  # the takeover's wait; the default (30 s) would only slow the test down


def test_a_batch_survives_kill_9_of_its_ingress_then_its_engine(tmp_path):
    config_path, db_url = local_config(tmp_path, accounting={"flush_interval_s": 0.5},
                                       batches={"lease_s": LEASE_S, "poll_s": 0.5, "retry_s": 0.5, "lines_in_flight": 2})
    db = make_engine(db_url)

    with serve_run(str(config_path), tmp_path / "serve_run.log", ADMIN_TOKEN) as proc:
        sdk = OpenAI(base_url=f"{BASE_URL}/v1", api_key=new_tenant_key(BASE_URL, ADMIN_TOKEN, "batch-crash"),
                     max_retries=0, timeout=30)
        lines = [{"custom_id": f"q{i}", "method": "POST", "url": "/v1/chat/completions",
                  "body": {"model": "SmolLM2-135M-Instruct", "max_tokens": MAX_TOKENS, "ignore_eos": True,
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
        dead_runner = row["lease_owner"]
        assert dead_runner is not None  # the killed replica's runner held it, and can never release it now

        wait_until(lambda: replica_pids(proc, "Ingress") - {ingress}, 120, "a replacement Ingress replica", interval_s=1)

        # The replacement's runner has taken the batch over and runs its lines: now the Engine replica.
        def resumed():
            try:
                now = sdk.batches.retrieve(batch.id)
            except OpenAIError:  # the replacement is not serving yet
                return False
            return now.request_counts.completed >= LINES - len(pending) + 2 or now.status != "in_progress"
        wait_until(resumed, 120, "the batch's lines to run again on the replacement Ingress", interval_s=0.05)
        [engine] = replica_pids(proc, "Engine")
        os.kill(engine, signal.SIGKILL)
        with db.connect() as conn:
            still = conn.execute(select(batches.c.status).where(batches.c.id == batch.id)).scalar()
        assert still == "in_progress", "the batch ended before the Engine kill: make its lines longer"
        wait_until(lambda: replica_pids(proc, "Engine") - {engine}, 300, "a replacement Engine replica", interval_s=1)

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
            assert o["response"]["body"]["usage"]["completion_tokens"] == MAX_TOKENS

        ids = {f"{batch.id}-{i}" for i in range(LINES)}

        def billed():
            with db.connect() as conn:
                rows = conn.execute(select(usage_records).where(
                    usage_records.c.request_id.like(f"{batch.id}-%"))).all()
            return rows if {r.request_id for r in rows} == ids else None
        rows = wait_until(billed, 60, "one ledger row per line", interval_s=0.5)
        assert len(rows) == LINES and all(r.batch for r in rows)  # exactly once each (request_id is the key)
        # Lines recorded before the kill were never sent again: they were billed their full answer.
        for r in rows:
            if int(r.request_id.rsplit("-", 1)[1]) not in pending:
                assert r.completion_tokens == MAX_TOKENS, r
