"""/v1/files and /v1/batches on the real ingress app (SQLite, a local store) over a fake engine:
OpenAI's shapes, per-tenant isolation, the upload's 4xx, the plan quotas; then the runner works a
batch through the same path online requests take (one EngineCall per line, marked batch, with its
deterministic request id), and every input line ends in exactly one output or error line."""

import asyncio
import json

from starlette.testclient import TestClient

from platform_app import build_platform_app
from loraplex.tenancy.models import TenantLimits

CHAT = "/v1/chat/completions"


def reply(method, call, request):
    if request.messages[0]["content"] == "overload" and reply.refusals < 1:
        from loraplex.contract import EngineError
        reply.refusals += 1
        yield EngineError(503, "shed", reason="shed")
        return
    yield {"id": call.request_id, "object": "chat.completion", "model": request.model,
           "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
           "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}


reply.refusals = 0


def line(custom_id, content="hello", model="SmolLM2-135M-Instruct", url=CHAT):
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url,
                       "body": {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 2}})


def upload(client, key, text, purpose="batch"):
    return client.post("/v1/files", headers={"Authorization": key}, data={"purpose": purpose},
                       files={"file": ("in.jsonl", text.encode())})


def make(tmp_path, **kw):
    platform = build_platform_app(tmp_path, reply, **kw)
    platform.add_tenant("acme")
    platform.add_tenant("other")
    return platform, TestClient(platform.app, raise_server_exceptions=False)


def test_upload_refuses_bad_files_with_a_4xx_naming_the_line(tmp_path):
    platform, client = make(tmp_path)
    key = platform.keys["acme"]
    try:
        bad = upload(client, key, line("a") + "\n{not json\n")
        assert bad.status_code == 400 and "Line 2" in bad.json()["error"]["message"]
        unknown = upload(client, key, line("a", url="/v1/embeddings"))
        assert unknown.status_code == 400 and "/v1/embeddings" in unknown.json()["error"]["message"]
        dup = upload(client, key, line("a") + "\n" + line("a"))
        assert dup.status_code == 400 and "custom_id" in dup.json()["error"]["message"]
        assert upload(client, key, line("a"), purpose="fine-tune").status_code == 400
        assert client.get("/v1/files", headers={"Authorization": key}).json()["data"] == []  # nothing stored
    finally:
        platform.close()


def test_an_oversize_file_gets_413(tmp_path):
    platform, client = make(tmp_path)
    platform.config.batches.max_file_bytes = 200  # the routes read the config object the app was built with
    try:
        big = upload(client, platform.keys["acme"], "\n".join(line(str(i)) for i in range(5)))
        assert big.status_code == 413 and "batches.max_file_bytes" in big.json()["error"]["message"]
        platform.config.batches.max_file_bytes = 10_000
        assert upload(client, platform.keys["acme"], line("a")).status_code == 200
    finally:
        platform.close()


def test_files_and_batches_are_the_tenants_own(tmp_path):
    platform, client = make(tmp_path)
    acme, other = platform.keys["acme"], platform.keys["other"]
    try:
        f = upload(client, acme, line("a") + "\n" + line("b"))
        assert f.status_code == 200, f.text
        file_id = f.json()["id"]
        assert f.json()["purpose"] == "batch" and f.json()["object"] == "file"
        assert client.get(f"/v1/files/{file_id}", headers={"Authorization": other}).status_code == 404
        assert client.get(f"/v1/files/{file_id}/content", headers={"Authorization": other}).status_code == 404
        # Another tenant cannot start a batch on it either.
        made = client.post("/v1/batches", headers={"Authorization": other},
                           json={"input_file_id": file_id, "endpoint": CHAT, "completion_window": "24h"})
        assert made.status_code == 404
        batch = client.post("/v1/batches", headers={"Authorization": acme},
                            json={"input_file_id": file_id, "endpoint": CHAT, "completion_window": "24h"}).json()
        assert batch["status"] == "validating" and batch["object"] == "batch"
        assert client.get(f"/v1/batches/{batch['id']}", headers={"Authorization": other}).status_code == 404
        assert client.post(f"/v1/batches/{batch['id']}/cancel", headers={"Authorization": other}).status_code == 404
        assert client.get("/v1/batches", headers={"Authorization": other}).json()["data"] == []
        assert [b["id"] for b in client.get("/v1/batches", headers={"Authorization": acme}).json()["data"]] == [batch["id"]]
        # The input of a batch not yet ended cannot be deleted under it.
        assert client.delete(f"/v1/files/{file_id}", headers={"Authorization": acme}).status_code == 409
        wrong = client.post("/v1/batches", headers={"Authorization": acme},
                            json={"input_file_id": file_id, "endpoint": "/v1/completions"})
        assert wrong.status_code == 400 and "one endpoint per batch" in wrong.json()["error"]["message"]
        cancelled = client.post(f"/v1/batches/{batch['id']}/cancel", headers={"Authorization": acme}).json()
        assert cancelled["status"] == "cancelling"
    finally:
        platform.close()


def test_the_plans_batch_quotas_hold(tmp_path):
    platform, client = make(tmp_path)
    platform.service.plans["default"] = TenantLimits(max_batch_files=1, max_batches_in_flight=1)
    platform.tenancy.keys.forget_tenant(platform.tenant_ids["acme"])
    key = platform.keys["acme"]
    try:
        file_id = upload(client, key, line("a")).json()["id"]
        second = upload(client, key, line("b"))
        assert second.status_code == 409 and "max_batch_files" in second.json()["error"]["message"]
        body = {"input_file_id": file_id, "endpoint": CHAT, "completion_window": "24h"}
        assert client.post("/v1/batches", headers={"Authorization": key}, json=body).status_code == 200
        again = client.post("/v1/batches", headers={"Authorization": key}, json=body)
        assert again.status_code == 429 and "max_batches_in_flight" in again.json()["error"]["message"]
        assert again.headers["Retry-After"]
        platform.service.update_tenant(platform.tenant_ids["acme"], limits={"max_batch_file_bytes": 10,
                                                                           "max_batch_files": 5})
        platform.tenancy.keys.forget_tenant(platform.tenant_ids["acme"])
        big = upload(client, key, line("c"))
        assert big.status_code == 413 and "max_batch_file_bytes" in big.json()["error"]["message"]
    finally:
        platform.close()


def test_the_runner_serves_every_line_once_through_the_online_path(tmp_path):
    platform, client = make(tmp_path)
    acme, other = platform.keys["acme"], platform.keys["other"]
    try:
        assert client.post("/v1/adapters", headers={"Authorization": other}, data={"name": "theirs"},
                           files={"file": ("a.tar.gz", platform.adapter_archive())}).status_code == 201
        text = "\n".join([line("a"), line("b", model="theirs"), line("c", content="overload"), line("d")])
        file_id = upload(client, acme, text).json()["id"]
        batch = client.post("/v1/batches", headers={"Authorization": acme},
                            json={"input_file_id": file_id, "endpoint": CHAT, "completion_window": "24h"}).json()
        runner = platform.app.state.batch_runner
        runner.config = runner.config.model_copy(update={"retry_s": 0.01})
        asyncio.run(runner.run_once())
        done = client.get(f"/v1/batches/{batch['id']}", headers={"Authorization": acme}).json()
        assert done["status"] == "completed", done
        assert done["request_counts"] == {"total": 4, "completed": 3, "failed": 1}
        out = client.get(f"/v1/files/{done['output_file_id']}/content", headers={"Authorization": acme}).text
        err = client.get(f"/v1/files/{done['error_file_id']}/content", headers={"Authorization": acme}).text
        outs = [json.loads(x) for x in out.splitlines()]
        errs = [json.loads(x) for x in err.splitlines()]
        assert sorted(o["custom_id"] for o in outs + errs) == ["a", "b", "c", "d"]  # each exactly once
        assert [e["custom_id"] for e in errs] == ["b"] and errs[0]["response"]["status_code"] == 404
        assert all(o["response"]["status_code"] == 200 for o in outs)
        calls = [r[1] for r in platform.engine.requests if r[0] == "generate"]
        assert all(c.batch and c.priority == 0 for c in calls)
        # Each line's request id is its batch's and its number: the shed one ran again under the same id.
        ids = [c.request_id for c in calls]
        assert sorted(set(ids)) == sorted(f"{batch['id']}-{i}" for i in (0, 2, 3))
        assert ids.count(f"{batch['id']}-2") == 2
        # Run again (a restart): nothing left to run, nothing runs twice.
        before = len(platform.engine.requests)
        asyncio.run(runner.run_once())
        assert len(platform.engine.requests) == before
    finally:
        platform.close()


def test_a_batch_stops_at_the_monthly_token_budget(tmp_path):
    # A batch is billed like online traffic: its lines meet monthly_token_budget (and nothing else
    # of the tenant's online limits). Each line here uses 3 tokens (the fake's prompt, no output).
    platform, client = make(tmp_path)
    tid, key = platform.tenant_ids["acme"], platform.keys["acme"]
    platform.service.update_tenant(tid, limits={"monthly_token_budget": 40, "requests_per_minute": 1})
    platform.tenancy.keys.forget_tenant(tid)
    try:
        file_id = upload(client, key, "\n".join(line(f"l{i}") for i in range(30))).json()["id"]
        batch = client.post("/v1/batches", headers={"Authorization": key},
                            json={"input_file_id": file_id, "endpoint": CHAT, "completion_window": "24h"}).json()
        runner = platform.app.state.batch_runner
        runner.config = runner.config.model_copy(update={"retry_s": 0.01, "lines_in_flight": 1})
        asyncio.run(runner.run_once())
        done = client.get(f"/v1/batches/{batch['id']}", headers={"Authorization": key}).json()
        assert done["status"] == "completed", done
        counts = done["request_counts"]
        ran = [r for r in platform.engine.requests if r[0] == "generate"]
        # requests_per_minute: 1 is the online traffic's, not the batch's: more than one line ran.
        assert counts["total"] == 30 and 1 < counts["completed"] == len(ran) and counts["failed"] > 0
        assert 3 * counts["completed"] <= 40  # never past the budget
        err = client.get(f"/v1/files/{done['error_file_id']}/content", headers={"Authorization": key}).text
        errs = [json.loads(x)["response"] for x in err.splitlines()]
        assert len(errs) == counts["failed"]
        assert all(e["status_code"] == 429 and e["body"]["error"]["code"] == "budget_exceeded" for e in errs)
        # The online path sees the same budget spent.
        online = client.post(CHAT, headers={"Authorization": key},
                             json={"model": "SmolLM2-135M-Instruct", "messages": [{"role": "user", "content": "x"}],
                                   "max_tokens": 2})
        assert online.status_code == 429 and online.json()["error"]["code"] == "budget_exceeded"
    finally:
        platform.close()


def test_batches_take_turns_so_a_big_one_does_not_hold_back_a_small_one(tmp_path):
    platform, client = make(tmp_path)
    acme, other = platform.keys["acme"], platform.keys["other"]
    try:
        body = {"endpoint": CHAT, "completion_window": "24h"}
        big_file = upload(client, acme, "\n".join(line(f"a{i}", content=f"acme {i}") for i in range(8))).json()["id"]
        big = client.post("/v1/batches", headers={"Authorization": acme}, json={**body, "input_file_id": big_file}).json()
        small_file = upload(client, other, "\n".join(line(f"o{i}", content=f"other {i}") for i in range(2))).json()["id"]
        small = client.post("/v1/batches", headers={"Authorization": other},
                            json={**body, "input_file_id": small_file}).json()
        runner = platform.app.state.batch_runner
        runner.config = runner.config.model_copy(update={"lines_in_flight": 1, "slice_s": 1e-6})
        while asyncio.run(runner.run_once()):  # each turn: one line (the slice), then the next batch
            pass
        for key, batch in ((acme, big), (other, small)):
            assert client.get(f"/v1/batches/{batch['id']}", headers={"Authorization": key}).json()["status"] == "completed"
        order = [r[2].messages[0]["content"] for r in platform.engine.requests if r[0] == "generate"]
        assert len(order) == 10
        # The small batch, created second, was done within the big one's first turns, not after its 8 lines.
        assert order.index("other 1") < order.index("acme 3"), order
    finally:
        platform.close()


def test_a_batch_parks_at_batch_tokens_per_day(tmp_path):
    # The day's limit on batch lines: the line that would pass it is not failed; the batch waits
    # (still in_progress, parked until the next UTC day) with what ran within the limit.
    from datetime import datetime, timedelta, timezone
    from sqlalchemy import select
    from loraplex.batches.tables import batches

    platform, client = make(tmp_path)
    tid, key = platform.tenant_ids["acme"], platform.keys["acme"]
    platform.service.update_tenant(tid, limits={"batch_tokens_per_day": 40})
    platform.tenancy.keys.forget_tenant(tid)
    try:
        file_id = upload(client, key, "\n".join(line(f"l{i}") for i in range(30))).json()["id"]
        batch = client.post("/v1/batches", headers={"Authorization": key},
                            json={"input_file_id": file_id, "endpoint": CHAT, "completion_window": "24h"}).json()
        runner = platform.app.state.batch_runner
        runner.config = runner.config.model_copy(update={"retry_s": 0.01, "lines_in_flight": 2})
        asyncio.run(runner.run_once())
        now = client.get(f"/v1/batches/{batch['id']}", headers={"Authorization": key}).json()
        assert now["status"] == "in_progress" and now["request_counts"]["failed"] == 0, now
        assert 1 < now["request_counts"]["completed"] < 30
        # The fake engine writes no ledger: the runner counts what its lines used (4 tokens each, the
        # reply's usage) until the ledger has them.
        assert 4 * now["request_counts"]["completed"] <= 40
        with platform.service.engine.connect() as conn:
            not_before = conn.execute(select(batches.c.not_before).where(batches.c.id == batch["id"])).scalar()
        tomorrow = (datetime.now(timezone.utc) + timedelta(days=1)).replace(hour=0, minute=0, second=0, microsecond=0)
        assert not_before == tomorrow
    finally:
        platform.close()
