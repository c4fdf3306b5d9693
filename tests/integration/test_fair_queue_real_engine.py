"""The fair queue on the real engine (issue 20), the noisy neighbour made small: tenant W keeps
more requests in flight than the shared platform's dispatch limit (conftest: 3, one newcomer
slot), tenant M sends one short request. M runs at once, while W's surplus waits in the queue;
a W request that cannot start before its deadline is refused from the queue, never billed.

Bypass the queue (every request handed to vLLM as it arrives) and W's queued requests start with
the rest, before M's reply ends: the ordering check fails. No timing thresholds: only order."""

import asyncio
import time

import httpx
import pytest
from sqlalchemy import select, text

from loraplex.accounting.tables import usage_records
from tenant_keys import ADMIN_TOKEN, new_tenant

pytestmark = pytest.mark.integration

W_REQUESTS = 8  # the dispatch limit (3) runs 3; 5 queue


def tenant(admin, name):
    tenant_id, key = new_tenant(admin, name)
    return tenant_id, {"Authorization": f"Bearer {key}"}


async def stream(client, headers, model, max_tokens, timeout_s=None):
    """(status, request id, first-token time, end time) of one streamed chat request."""
    extra = {"X-LoRAPlex-Timeout": str(timeout_s)} if timeout_s else {}
    body = {"model": model, "messages": [{"role": "user", "content": "Tell me a long story about ships."}],
            "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0, "stream": True}
    first = None
    async with client.stream("POST", "/v1/chat/completions", json=body, headers={**headers, **extra}) as r:
        async for line in r.aiter_lines():
            if first is None and line.startswith("data: {") and '"content"' in line:
                first = time.monotonic()
        return r.status_code, r.headers.get("x-loraplex-request-id"), first, time.monotonic()


def ledger(usage_db, tenant_id, n, timeout_s=20.0):
    deadline = time.time() + timeout_s
    while True:
        with usage_db.connect() as conn:
            rows = [r._asdict() for r in conn.execute(
                select(usage_records).where(usage_records.c.tenant_id == tenant_id))]
        if len(rows) >= n or time.time() > deadline:
            return rows
        time.sleep(0.2)


async def watch_queue(client, until: asyncio.Task, seen: list) -> None:
    """The replica's per-tenant queue entries (GET /admin/replicas) until `until` is done."""
    while not until.done():
        r = await client.get("/admin/replicas", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
        if r.status_code == 200:
            seen.extend(replica["tenants"] for replica in r.json()["data"])
        await asyncio.sleep(0.2)


def test_a_newcomer_runs_at_once_while_the_neighbours_surplus_waits(base_url, admin, model_name, usage_db):
    w_id, w = tenant(admin, "fair-noisy")
    m_id, m = tenant(admin, "fair-meek")
    seen: list = []

    async def run():
        async with httpx.AsyncClient(base_url=base_url, timeout=300) as client:
            flood = [asyncio.create_task(stream(client, w, model_name, 48)) for _ in range(W_REQUESTS)]
            await asyncio.sleep(1.5)  # W's requests are at the replica: 3 run, 5 queue
            late = asyncio.create_task(stream(client, w, model_name, 48, timeout_s=1.0))
            meek = asyncio.create_task(stream(client, m, model_name, 16))
            await watch_queue(client, meek, seen)
            return await meek, await late, await asyncio.gather(*flood)

    meek, late, flood = asyncio.run(run())
    # While W was backlogged, M's request ran having waited 0 s in the fair queue (a reserved slot):
    # its time to first token was the engine's, not the queue's.
    m_running = [t[m_id] for t in seen if m_id in t and t[m_id]["running"]]
    assert m_running, seen
    assert all(e["queue_wait_s"] == 0.0 and e["dispatches"] == 1 and e["queued"] == 0 for e in m_running), m_running
    assert any(t.get(w_id, {}).get("queued") for t in seen if m_id in t), seen
    m_status, _, _, m_end = meek
    assert m_status == 200
    assert all(status == 200 for status, *_ in flood), flood
    # W's surplus waited in the queue: it started only after M's whole reply.
    started_after_m = sum(1 for _, _, first, _ in flood if first is not None and first > m_end)
    assert started_after_m >= W_REQUESTS - 3 - 1, (started_after_m, flood, meek)
    # The late request could not start before its deadline: refused from the queue, 503.
    assert late[0] == 503, late

    # Ledger: every request that ran is billed once; the refused one is a refusal, never billed.
    w_rows = ledger(usage_db, w_id, W_REQUESTS)
    assert sorted(r["request_id"] for r in w_rows) == sorted(rid for _, rid, _, _ in flood)
    assert len(ledger(usage_db, m_id, 1)) == 1
    assert late[1] not in {r["request_id"] for r in w_rows}
    deadline = time.monotonic() + 15
    while True:
        rejections = admin.get("/admin/usage", params={"tenant": w_id}).json()["rejections"]
        if rejections or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert {"tenant": w_id, "reason": "503:queue_deadline", "count": 1} in [
        {k: r[k] for k in ("tenant", "reason", "count")} for r in rejections]  # rows also carry tenant_name

    replicas = admin.get("/admin/replicas")
    assert replicas.status_code == 200, replicas.text
    [replica] = replicas.json()["data"]
    assert replica["dispatch_limit"] == 3 and "tenants" in replica and "loaded_adapters" in replica
