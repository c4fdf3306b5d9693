"""The Batch API on the real engine, through the `openai` SDK unchanged: a small batch runs to
completion from an Ingress replica's runner, every input line ends in exactly one output or error
line, and the ledger holds one batch-marked row per line the engine ran, under the line's id."""

import json
import time

import pytest
from openai import OpenAI
from sqlalchemy import select

from loraplex.accounting.tables import usage_records
from tenant_keys import new_tenant_key

pytestmark = pytest.mark.integration


def test_a_batch_runs_through_the_sdk_and_every_line_is_answered_and_billed_once(base_url, admin, model_name, usage_db):
    key = new_tenant_key(admin, "batcher")
    sdk = OpenAI(base_url=f"{base_url}/v1", api_key=key, max_retries=0, timeout=60)
    lines = [{"custom_id": f"q{i}", "method": "POST", "url": "/v1/chat/completions",
              "body": {"model": model_name, "max_tokens": 4, "temperature": 0,
                       "messages": [{"role": "user", "content": f"Count to {i}."}]}} for i in range(5)]
    # An adapter this tenant does not have (another tenant's is answered the same): that line's error.
    lines.append({"custom_id": "missing", "method": "POST", "url": "/v1/chat/completions",
                  "body": {"model": "not-mine", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}})
    upload = sdk.files.create(file=("in.jsonl", "\n".join(json.dumps(x) for x in lines).encode()), purpose="batch")
    assert upload.purpose == "batch" and upload.bytes > 0
    batch = sdk.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert batch.status == "validating"
    deadline = time.time() + 300
    while batch.status not in ("completed", "failed", "expired", "cancelled") and time.time() < deadline:
        time.sleep(1)
        batch = sdk.batches.retrieve(batch.id)
    assert batch.status == "completed", batch
    assert (batch.request_counts.total, batch.request_counts.completed, batch.request_counts.failed) == (6, 5, 1)
    out = [json.loads(x) for x in sdk.files.content(batch.output_file_id).text.splitlines()]
    err = [json.loads(x) for x in sdk.files.content(batch.error_file_id).text.splitlines()]
    assert sorted(x["custom_id"] for x in out + err) == sorted(x["custom_id"] for x in lines)  # each exactly once
    assert [e["custom_id"] for e in err] == ["missing"] and err[0]["response"]["status_code"] == 404
    for o in out:
        assert o["response"]["status_code"] == 200
        assert o["response"]["body"]["choices"][0]["message"]["content"]
        assert o["response"]["body"]["usage"]["completion_tokens"] == 4
    ran = {f"{batch.id}-{i}" for i in range(5)}
    rows = {}
    for _ in range(75):  # the replicas' ledgers flush every 0.2 s
        with usage_db.connect() as conn:
            rows = {r.request_id: r for r in conn.execute(
                select(usage_records).where(usage_records.c.request_id.like(f"{batch.id}-%")))}
        if set(rows) == ran:
            break
        time.sleep(0.2)
    assert set(rows) == ran  # one row per line the engine ran, none for the refused one
    assert all(r.batch and r.completion_tokens == 4 for r in rows.values())
    assert [b.id for b in sdk.batches.list(limit=5).data] == [batch.id]
