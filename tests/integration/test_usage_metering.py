"""Every request the real engine serves is metered exactly once, for the tokens it processed."""

import asyncio
import time

import httpx
import pytest
from sqlalchemy import func, select

from loraplex.accounting.tables import usage_records
from waiting import wait_until

pytestmark = pytest.mark.integration

# Over one 128-token KV block on the CPU backend, so a repeat can hit the prefix cache.
SYSTEM = "You are a concise assistant for a shipping company. " + " ".join(
    f"Rule {i}: answer in plain words and never invent tracking numbers." for i in range(40)
)


def records(usage_db, request_ids, timeout_s: float = 15.0) -> dict[str, dict]:
    """The ledger rows of these requests, waiting for the replicas' flush (every 0.2 s here)."""
    deadline = time.time() + timeout_s
    while True:
        with usage_db.connect() as conn:
            rows = conn.execute(select(usage_records).where(usage_records.c.request_id.in_(list(request_ids))))
            found = {r.request_id: r._asdict() for r in rows}
        if len(found) == len(set(request_ids)) or time.time() > deadline:
            return found
        time.sleep(0.2)


def chat_body(model, content, **extra):
    return {"model": model, "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": content}],
            "temperature": 0, **extra}


def test_streamed_and_plain_request_record_the_same_prompt_tokens(client, model_name, usage_db):
    plain = client.post("/v1/chat/completions", json=chat_body(model_name, "Where is my parcel?", max_tokens=8))
    assert plain.status_code == 200, plain.text
    streamed = client.post("/v1/chat/completions", json=chat_body(
        model_name, "Where is my parcel?", max_tokens=8, stream=True, stream_options={"include_usage": True}))
    assert streamed.status_code == 200
    ids = [plain.headers["x-loraplex-request-id"], streamed.headers["x-loraplex-request-id"]]
    got = records(usage_db, ids)
    assert set(got) == set(ids)
    a, b = got[ids[0]], got[ids[1]]
    assert a["prompt_tokens"] == b["prompt_tokens"] == plain.json()["usage"]["prompt_tokens"]
    assert a["completion_tokens"] == plain.json()["usage"]["completion_tokens"] == 8
    assert a["status"] == b["status"] == "length"
    assert b["completion_tokens"] == 8
    for r in (a, b):
        assert r["base_model"] == model_name and r["adapter"] is None and r["api_key_id"].startswith("key")
        assert r["arrival_time"] <= r["first_token_time"] <= r["finish_time"] and r["ttft"] > 0
        assert r["replica_id"]


def test_repeated_prompt_records_cached_prompt_tokens(client, model_name, usage_db):
    body = chat_body(model_name, "What are your opening hours?", max_tokens=2)
    ids = []
    for _ in range(2):
        reply = client.post("/v1/chat/completions", json=body)
        assert reply.status_code == 200
        ids.append(reply.headers["x-loraplex-request-id"])
    second = records(usage_db, ids)[ids[1]]
    assert second["cached_prompt_tokens"] >= 128, second
    assert reply.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == second["cached_prompt_tokens"]


def test_n_concurrent_requests_give_exactly_n_records(base_url, api_key, model_name, usage_db):
    n = 12

    async def one(client, i):
        stream = i % 2 == 0
        r = await client.post("/v1/chat/completions", json={
            "model": model_name, "messages": [{"role": "user", "content": f"Count to {i}."}],
            "max_tokens": 4 + i, "temperature": 0, "stream": stream})
        assert r.status_code == 200, r.text
        return r.headers["x-loraplex-request-id"], 4 + i

    async def all_of_them():
        async with httpx.AsyncClient(base_url=base_url, headers={"Authorization": f"Bearer {api_key}"},
                                     timeout=300) as client:
            return await asyncio.gather(*(one(client, i) for i in range(n)))

    sent = asyncio.run(all_of_them())
    got = records(usage_db, [rid for rid, _ in sent])
    assert len(got) == n
    for rid, max_tokens in sent:
        assert 0 < got[rid]["completion_tokens"] <= max_tokens


def test_disconnect_is_billed_for_the_tokens_generated(base_url, api_key, model_name, engine_handle, usage_db):
    body = {"model": model_name, "messages": [{"role": "user", "content": "Tell me a very long story."}],
            "max_tokens": 1900, "ignore_eos": True, "stream": True}
    with httpx.Client(timeout=120, headers={"Authorization": f"Bearer {api_key}"}) as client:
        with client.stream("POST", f"{base_url}/v1/chat/completions", json=body) as response:
            request_id = response.headers["x-loraplex-request-id"]
            lines = response.iter_lines()
            received = 0
            while received < 6:
                received += next(lines).startswith("data: ")
    row = records(usage_db, [request_id])[request_id]
    assert row["status"] == "client_disconnect"
    # At least what reached the client (the first event carries only the role), far from 1900.
    assert received - 1 <= row["completion_tokens"] < 1900
    assert row["prompt_tokens"] > 0
    # The abort has landed: nothing left running (a health probe may be for a moment).
    wait_until(lambda: engine_handle.num_unfinished_requests.remote().result() == 0, 10,
               "the engine to have no unfinished request")


def tenant_rows(usage_db, tenant_id: str) -> int:
    with usage_db.connect() as conn:
        return conn.execute(select(func.count()).select_from(usage_records)
                            .where(usage_records.c.tenant_id == tenant_id)).scalar()


def test_refused_request_is_not_a_usage_record(base_url, admin, model_name, usage_db):
    """A prompt the engine rejects (over max_model_len) is counted as a refusal, never billed: the
    tenant's ledger rows grow by the one request that was served, not by the refused one."""
    tenant_id = admin.post("/admin/tenants", json={"name": "refused"}).json()["id"]
    key = admin.post(f"/admin/tenants/{tenant_id}/keys").json()["key"]
    with httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {key}"}, timeout=120) as client:
        too_long = client.post("/v1/completions", json={"model": model_name, "prompt": "hi " * 3000, "max_tokens": 1})
        assert too_long.status_code == 400, too_long.text
        # Then a request that is served, on the same replica and spool: once its row has landed,
        # a record of the refused one (appended before it) would have landed too.
        ok = client.post("/v1/completions", json={"model": model_name, "prompt": "hi", "max_tokens": 1})
        assert ok.status_code == 200, ok.text
    request_id = ok.headers["x-loraplex-request-id"]
    row = wait_until(lambda: records(usage_db, [request_id], timeout_s=0).get(request_id), 30,
                     "the served request's usage record")
    assert row["tenant_id"] == tenant_id
    assert tenant_rows(usage_db, tenant_id) == 1, "the refused request was billed"
    # The refusal is counted (diagnostics, not billing) under the tenant.
    report = admin.get("/admin/usage", params={"tenant": tenant_id, "start": "2000-01-01", "end": "2100-01-01"})
    assert report.status_code == 200, report.text
    assert report.json()["total"]["requests"] == 1
    assert [(r["reason"], r["count"]) for r in report.json()["rejections"]] == [("400", 1)], report.json()


def test_ledger_reconciles_with_the_engines_own_token_counters(client, model_name, engine_handle, usage_db):
    """Over a window, the ledger's prompt + completion tokens equal vLLM's prompt and generation
    counters, less the health probes (1 + 1 tokens each) that nobody is billed for."""

    def counters():
        c = engine_handle.engine_counters.remote().result()
        return c["prompt_tokens"] + c["generation_tokens"] - 2 * c["probes"]

    before = counters()
    ids = []
    for i, stream in enumerate([False, True, False, True, False]):
        r = client.post("/v1/chat/completions", json=chat_body(model_name, f"Question {i}: is it late?",
                                                               max_tokens=5 + i, stream=stream))
        assert r.status_code == 200
        ids.append(r.headers["x-loraplex-request-id"])
    got = records(usage_db, ids)
    assert len(got) == len(ids)
    ledger = sum(r["prompt_tokens"] + r["completion_tokens"] for r in got.values())
    deadline = time.time() + 5  # vLLM updates its counters from its output loop, a beat later
    while counters() - before != ledger and time.time() < deadline:
        time.sleep(0.2)
    assert counters() - before == ledger


def test_usage_report_totals_equal_the_records(client, model_name, usage_db):
    reply = client.post("/v1/chat/completions", json=chat_body(model_name, "Last question.", max_tokens=3))
    rid = reply.headers["x-loraplex-request-id"]
    tenant = records(usage_db, [rid])[rid]["tenant_id"]
    report = client.get("/v1/usage", params={"group_by": "model", "end": "2100-01-01", "start": "2000-01-01"})
    assert report.status_code == 200, report.text
    with usage_db.connect() as conn:
        rows = conn.execute(select(usage_records).where(usage_records.c.tenant_id == tenant)).all()
    total = report.json()["total"]
    assert total["requests"] == len(rows)
    for column in ("prompt_tokens", "cached_prompt_tokens", "completion_tokens"):
        assert total[column] == sum(getattr(r, column) for r in rows)
    csv_report = client.get("/v1/usage", params={"format": "csv", "start": "2000-01-01", "end": "2100-01-01"})
    assert csv_report.headers["content-type"].startswith("text/csv")
    assert csv_report.text.splitlines()[0].split(",")[1:] == [
        "prompt_tokens", "cached_prompt_tokens", "completion_tokens", "requests", "cost"]
