"""Tenant routes with real tenancy + registry (SQLite, local store) and a fake engine."""

import io
import json
import sys
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from fake_engine import FakeEngineClient
from loraplex.accounting.accounting import Accounting
from loraplex.accounting.rejections import rejection_counts
from loraplex.config import PlatformConfig
from loraplex.db.engine import make_engine
from loraplex.contract import AdapterTarget
from loraplex.ingress.app import build_ingress_app
from loraplex.registry.registry import build_registry
from loraplex.tenancy.service import TenantService
from loraplex.tenancy.tenancy import Tenancy

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "registry"))
from registry_builders import SMOLLM2_CONFIG, lora_config, lora_tensors, tar_dir, write_adapter  # noqa: E402

from loraplex.registry.model_spec import BaseModelSpec  # noqa: E402

BASE = "SmolLM2-135M-Instruct"


def script(method, call, request):
    # Echo what the engine was asked to run with, so tests can see resolution, salting and metering.
    yield {"model": request.model, "adapter": call.adapter.lora_name if call.adapter else None,
           "salt": call.cache_salt, "request_id": request.request_id,
           "call": {"request_id": call.request_id, "tenant_id": call.tenant_id, "api_key_id": call.api_key_id,
                    "adapter": call.adapter_label, "arrival_time": call.arrival_time,
                    "routing_key": call.routing_key, "priority": call.priority}}


@pytest.fixture
def setup(tmp_path):
    model_dir = tmp_path / BASE
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps(SMOLLM2_CONFIG))
    config = PlatformConfig.from_args({
        "engine": {"model": str(model_dir)},
        "database_url": f"sqlite:///{tmp_path}/db.sqlite",
        "registry": {"store_url": str(tmp_path / "store"), "cache_dir": str(tmp_path / "cache"), "max_upload_bytes": 4 << 20},
    })
    db = make_engine(config.database_url)
    service = TenantService(db)
    tenancy = Tenancy(service, admin_token="admin")
    engine = FakeEngineClient(script, calls={"base_models": {"object": "list", "data": [{"id": BASE, "parent": None}]}})
    accounting = Accounting.start(config.accounting.model_copy(update={"spool_dir": str(tmp_path / "spool")}),
                                  db, "ingress-test", plan_of=service.plan_of)
    client = TestClient(build_ingress_app(engine, config, tenancy=tenancy, registry=build_registry(config, db),
                                          accounting=accounting), raise_server_exceptions=False)
    client.accounting = accounting
    keys = {}
    for name in ("acme", "globex"):
        tenant = service.create_tenant(name)
        keys[name] = {"Authorization": f"Bearer {service.issue_key(tenant.id)[1]}"}
    spec = BaseModelSpec.from_config(SMOLLM2_CONFIG, BASE)
    archives = {}
    for r in (4, 8):
        src = write_adapter(tmp_path / f"a{r}", lora_config(r=r), lora_tensors(spec, r=r, fill=0.01 * r))
        archives[r] = tar_dir(src, tmp_path / f"a{r}.tar.gz").read_bytes()
    return client, keys, engine, archives


def upload(client, headers, name, data):
    return client.post("/v1/adapters", headers=headers, data={"name": name},
                       files={"file": ("a.tar.gz", io.BytesIO(data), "application/gzip")})


def chat(client, headers, model):
    return client.post("/v1/chat/completions", headers=headers,
                       json={"model": model, "messages": [{"role": "user", "content": "hi"}]})


def test_v1_needs_a_key(setup):
    client, keys, _, _ = setup
    assert chat(client, {}, BASE).status_code == 401
    assert client.get("/v1/models").status_code == 401
    assert upload(client, {"Authorization": "Bearer lpx-x"}, "a", b"x").status_code == 401


def test_upload_resolve_and_isolation(setup):
    client, keys, engine, archives = setup
    first = upload(client, keys["acme"], "style", archives[4])
    assert first.status_code == 201, first.text
    assert first.json()["version"] == 1 and first.json()["rank"] == 4
    # The served model's name, not what adapter_config.json claims (a hub id or the trainer's path).
    assert first.json()["base_model"] == BASE
    assert client.get("/v1/adapters", headers=keys["acme"]).json()["data"][0]["versions"][0]["base_model"] == BASE
    assert upload(client, keys["acme"], "style", archives[8]).json()["version"] == 2
    assert upload(client, keys["acme"], "style", archives[4]).json()["version"] == 1  # same weights

    body = chat(client, keys["acme"], "style").json()
    assert "/style@" in body["adapter"]
    sha2 = upload(client, keys["acme"], "style", archives[8]).json()["sha256"]
    assert body["adapter"].endswith(sha2)  # `style` = the newest version
    assert chat(client, keys["acme"], "style@1").json()["adapter"] != body["adapter"]
    assert chat(client, keys["acme"], f"style@{sha2}").json()["adapter"] == body["adapter"]

    # Base model: no adapter, but the tenant's own salt; tenants never share a salt.
    acme_base = chat(client, keys["acme"], BASE).json()
    globex_base = chat(client, keys["globex"], BASE).json()
    assert acme_base["adapter"] is None and acme_base["salt"] and acme_base["salt"] != globex_base["salt"]

    for ref in ("style", "style@1", f"style@{sha2}"):
        error = chat(client, keys["globex"], ref)
        assert error.status_code == 404 and error.json()["error"]["param"] == "model"
    assert [m["id"] for m in client.get("/v1/models", headers=keys["acme"]).json()["data"]] == [BASE, "style"]
    assert [m["id"] for m in client.get("/v1/models", headers=keys["globex"]).json()["data"]] == [BASE]


def test_adapter_target_carries_a_stable_catalog_id(setup):
    client, keys, engine, archives = setup
    upload(client, keys["acme"], "style", archives[4])
    chat(client, keys["acme"], "style")
    chat(client, keys["acme"], "style")
    targets = [call.adapter for _method, call, _request in engine.requests if call.adapter]
    assert len(targets) == 2 and isinstance(targets[0], AdapterTarget)
    assert targets[0].lora_int_id == targets[1].lora_int_id > 0
    assert targets[0].requested_as == "style"


def test_list_show_delete(setup):
    client, keys, _, archives = setup
    upload(client, keys["acme"], "style", archives[4])
    upload(client, keys["acme"], "style", archives[8])
    listed = client.get("/v1/adapters", headers=keys["acme"]).json()["data"]
    assert [(a["name"], len(a["versions"])) for a in listed] == [("style", 2)]
    assert client.get("/v1/adapters/style", headers=keys["globex"]).status_code == 404
    assert client.delete("/v1/adapters/style@1", headers=keys["acme"]).status_code == 200
    assert chat(client, keys["acme"], "style@1").status_code == 404
    assert chat(client, keys["acme"], "style").status_code == 200
    assert client.delete("/v1/adapters/style", headers=keys["globex"]).status_code == 404
    assert client.delete("/v1/adapters/style", headers=keys["acme"]).status_code == 200
    assert chat(client, keys["acme"], "style").status_code == 404
    assert client.get("/v1/adapters", headers=keys["acme"]).json()["data"] == []


@pytest.mark.parametrize("form, files, status", [
    ({}, None, 400),
    ({"name": "x"}, None, 400),
    ({"name": "../evil"}, "good", 400),
    ({"name": "x"}, b"not an archive", 400),
])
def test_bad_uploads_get_4xx_and_server_keeps_serving(setup, form, files, status):
    client, keys, _, archives = setup
    kwargs = {"data": form}
    if files is not None:
        payload = archives[4] if files == "good" else files
        kwargs["files"] = {"file": ("a.tar.gz", io.BytesIO(payload), "application/gzip")}
    response = client.post("/v1/adapters", headers=keys["acme"], **kwargs)
    assert response.status_code == status, response.text
    assert response.json()["error"]["message"]
    assert chat(client, keys["acme"], BASE).status_code == 200


def test_upload_over_the_limit_is_413(setup):
    client, keys, _, _ = setup
    big = io.BytesIO(b"\0" * (5 << 20))
    response = client.post("/v1/adapters", headers=keys["acme"], data={"name": "big"},
                           files={"file": ("a.tar.gz", big, "application/gzip")})
    assert response.status_code == 413


def test_every_request_carries_its_metering_context(setup):
    client, keys, engine, archives = setup
    assert upload(client, keys["acme"], "style", archives[4]).status_code == 201
    body = {"model": "style", "messages": [{"role": "user", "content": "hi"}], "request_id": "client-chosen"}
    reply = client.post("/v1/chat/completions", headers=keys["acme"], json=body)
    assert reply.status_code == 200
    call = reply.json()["call"]
    # The id is ours (a client-chosen one could collide in the ledger and in vLLM), and echoed.
    assert reply.json()["request_id"] == call["request_id"] == reply.headers["x-loraplex-request-id"] != "client-chosen"
    acme = client.get("/v1/models", headers=keys["acme"]).json()["data"][1]["owned_by"]
    assert call["tenant_id"] == acme and call["adapter"] == "style@1" and call["api_key_id"].startswith("key")
    assert call["arrival_time"] > 0
    # The router's key: tenant/adapter name, so every version of one adapter shares a replica.
    assert call["routing_key"] == f"{acme}/style"
    second = chat(client, keys["acme"], BASE)
    assert second.json()["call"]["adapter"] is None and second.json()["call"]["routing_key"] == acme
    assert second.headers["x-loraplex-request-id"] != reply.headers["x-loraplex-request-id"]


def test_refusals_before_the_engine_are_counted_not_billed(setup):
    from datetime import datetime, timedelta, timezone

    client, keys, engine, _ = setup
    sent = len(engine.requests)
    assert chat(client, {}, BASE).status_code == 401
    assert chat(client, keys["acme"], "no-such-adapter").status_code == 404
    assert client.post("/v1/chat/completions", headers=keys["acme"], content=b"{").status_code == 400
    assert len(engine.requests) == sent  # none reached the engine
    client.accounting.ledger.flush()
    now = datetime.now(timezone.utc)
    counts = {(c.tenant_id == "-", c.reason): c.count for c in
              rejection_counts(client.accounting.db, now - timedelta(hours=2), now + timedelta(hours=1))}
    assert counts == {(True, "401"): 1, (False, "404"): 1, (False, "400"): 1}
    assert chat(client, keys["acme"], BASE).status_code == 200  # still serving


def _rows_and_refusals(client):
    from datetime import datetime, timedelta, timezone

    from sqlalchemy import select

    from loraplex.accounting.tables import usage_records

    client.accounting.ledger.flush()
    with client.accounting.db.connect() as conn:
        rows = [r._asdict() for r in conn.execute(select(usage_records))]
    now = datetime.now(timezone.utc)
    refusals = {c.reason: c.count for c in
                rejection_counts(client.accounting.db, now - timedelta(hours=2), now + timedelta(hours=1))}
    return rows, refusals


def test_engine_lost_mid_stream_bills_what_the_client_received(setup):
    client, keys, engine, _ = setup

    def dies_after_three_tokens(method, call, request):
        yield from ['data: {"choices":[{"delta":{"content":"a"}}]}\n\n'] * 3
        raise RuntimeError("ActorDiedError: the replica was killed")

    engine.script = dies_after_three_tokens
    body = {"model": BASE, "messages": [{"role": "user", "content": "hi"}], "stream": True}
    reply = client.post("/v1/chat/completions", headers=keys["acme"], json=body)
    assert reply.status_code == 200 and '"error"' in reply.text and reply.text.endswith("data: [DONE]\n\n")
    rows, refusals = _rows_and_refusals(client)
    # ingress.max_migrations (2) moves: each replica (this fake) sends 3 tokens, then dies; the client
    # received 9, billed once with the prompt once, the two take-overs' prefill apart.
    assert reply.text.count('"a"') == 9
    assert [(r["request_id"], r["status"], r["prompt_tokens"], r["completion_tokens"], r["migrated_prompt_tokens"])
            for r in rows] == [(reply.headers["x-loraplex-request-id"], "engine_error", 3, 9, 6)]
    assert refusals == {}  # billed, so not also a refusal


def test_engine_lost_mid_stream_on_another_path_is_billed_from_the_call_that_ran(setup):
    import dataclasses

    from loraplex.contract import EngineLost

    client, keys, engine, _ = setup

    def merged_replica_dies(method, call, request):
        yield 'data: {"choices":[{"delta":{"content":"a"}}]}\n\n'
        ran = dataclasses.replace(call, path="merged", adapter=AdapterTarget(
            "t/pirate@1:" + "a" * 64, 7, call.tenant_id, "pirate", "a" * 64, "pirate", version=1))
        raise EngineLost(ran, RuntimeError("ActorDiedError: the merged replica was killed"))

    engine.script = merged_replica_dies
    body = {"model": BASE, "messages": [{"role": "user", "content": "hi"}], "stream": True}
    reply = client.post("/v1/chat/completions", headers=keys["acme"], json=body)
    assert reply.status_code == 200 and reply.text.endswith("data: [DONE]\n\n")
    rows, _ = _rows_and_refusals(client)
    assert [(r["status"], r["path"]) for r in rows] == [("engine_error", "merged")]


def test_adapter_deleted_before_the_engine_ran_is_a_404_refusal(setup):
    from loraplex.contract import EngineError

    client, keys, engine, _ = setup
    engine.script = lambda method, call, request: iter(
        [EngineError(404, "The model `style` was deleted.", "NotFoundError", "model")])
    reply = chat(client, keys["acme"], BASE)
    assert reply.status_code == 404 and reply.json()["error"]["param"] == "model"
    rows, refusals = _rows_and_refusals(client)
    assert rows == [] and refusals == {"404": 1}


def test_idempotency_key_replays_the_reply_and_bills_once(setup):
    """Idempotency-Key (ingress/idempotency.py): the same tenant, key and body again get the same
    reply without running; another body is a 422; another tenant's key is its own."""
    client, keys, engine, _ = setup
    body = {"model": BASE, "messages": [{"role": "user", "content": "hi"}]}
    first = client.post("/v1/chat/completions", headers={**keys["acme"], "Idempotency-Key": "k1"}, json=body)
    again = client.post("/v1/chat/completions", headers={**keys["acme"], "Idempotency-Key": "k1"}, json=body)
    assert first.status_code == again.status_code == 200
    assert again.content == first.content and again.headers["idempotent-replayed"] == "true"
    assert again.headers["x-loraplex-request-id"] == first.headers["x-loraplex-request-id"]
    other = client.post("/v1/chat/completions", headers={**keys["acme"], "Idempotency-Key": "k1"},
                        json={**body, "max_tokens": 3})
    assert other.status_code == 422 and other.json()["error"]["param"] == "Idempotency-Key"
    globex = client.post("/v1/chat/completions", headers={**keys["globex"], "Idempotency-Key": "k1"}, json=body)
    assert globex.status_code == 200 and "idempotent-replayed" not in globex.headers
    assert len([r for r in engine.requests if r[0] == "generate"]) == 2  # acme once, globex once


def test_an_idempotent_stream_runs_on_after_its_client_left_and_the_retry_gets_all_of_it(setup):
    import threading

    client, keys, engine, _ = setup
    gate = threading.Event()

    def slow_stream(method, call, request):
        yield 'data: {"choices":[{"delta":{"content":"a"}}]}\n\n'
        gate.wait(5)  # the client leaves while the engine is still generating
        yield from ['data: {"choices":[{"delta":{"content":"b"}}]}\n\n', "data: [DONE]\n\n"]

    engine.script = slow_stream
    body = {"model": BASE, "messages": [{"role": "user", "content": "hi"}], "stream": True}
    headers = {**keys["acme"], "Idempotency-Key": "stream-1"}
    with client.stream("POST", "/v1/chat/completions", headers=headers, json=body) as reply:
        first_line = next(reply.iter_lines())
        request_id = reply.headers["x-loraplex-request-id"]
    assert '"a"' in first_line
    gate.set()
    again = client.post("/v1/chat/completions", headers=headers, json=body)
    assert again.status_code == 200 and again.headers["x-loraplex-request-id"] == request_id
    assert again.text.count('"content"') == 2 and again.text.endswith("data: [DONE]\n\n")
    assert len([r for r in engine.requests if r[0] == "generate"]) == 1  # one engine request: billed once


def test_idempotency_records_rerun_a_request_whose_ingress_died_and_forget_a_failed_one():
    from loraplex.ingress.idempotency import IdempotencyRecords

    alive = {"ingress-a": True}
    records = IdempotencyRecords(60, owner_alive=lambda owner: alive.get(owner, False))
    assert records.claim("t", "k", "h", "ingress-a", "r1").outcome == "run"
    assert records.claim("t", "k", "h", "ingress-b", "r2").outcome == "wait"
    alive["ingress-a"] = False  # its Ingress replica died with it: the engine aborted it
    rerun = records.claim("t", "k", "h", "ingress-b", "r3")
    assert (rerun.outcome, rerun.request_id, rerun.again) == ("run", "r1", True)
    records.finish("t", "k", "r1", None)  # it failed with nothing to keep: a retry runs it afresh
    assert records.claim("t", "k", "h", "ingress-b", "r4").request_id == "r4"
    records.finish("t", "k", "r4", (200, "application/json", b"{}"))
    assert records.claim("t", "k", "h", "ingress-c", "r5").reply == (200, "application/json", b"{}")
    assert records.claim("t", "k", "other", "ingress-c", "r6").outcome == "conflict"
