"""Merged or LoRA per call (path_choice), the ingress client that follows it and falls back
(engine_client), and what a dedicated replica refuses (replica.path_refusal)."""

import asyncio

from loraplex.contract import AdapterTarget, EngineCall, EngineChunk, EngineError
from loraplex.dedicated.engine_client import PathChoosingEngineClient
from loraplex.dedicated.path_choice import DedicatedPaths
from loraplex.dedicated.replica import path_refusal
from loraplex.dedicated.targets import DedicatedTarget

PIRATE = DedicatedTarget(7, "ten_a", "pirate", 1, "a" * 64, "config")
BANANA = DedicatedTarget(9, "ten_a", "banana", 2, "b" * 64, "admin")


def call(adapter_id=7, sha="a" * 64, tenant="ten_a", path="lora") -> EngineCall:
    target = AdapterTarget(f"{tenant}/x@1:{sha}", adapter_id, tenant, "x", sha, "x", version=1)
    return EngineCall(request_id="r", tenant_id=tenant, adapter=target, path=path)


def healthy_paths(**kw) -> DedicatedPaths:
    paths = DedicatedPaths.of([PIRATE, BANANA], failure_backoff_s=15)
    paths.observe({"Merged-7": ("HEALTHY", 1), "Merged-9": ("HEALTHY", 1)}, admin_marked={9})
    return paths


def test_a_healthy_marked_version_goes_merged_anything_else_lora():
    paths = healthy_paths()
    assert paths.choose(call(7), now=0) == "merged"
    assert paths.choose(call(9, sha="b" * 64), now=0) == "merged"
    assert paths.choose(call(8), now=0) == "lora"  # another version, not dedicated
    assert paths.choose(EngineCall(request_id="r", tenant_id="ten_a"), now=0) == "lora"  # the base model


def test_an_unhealthy_or_replicaless_deployment_sends_its_version_to_lora():
    paths = healthy_paths()
    for status in [("UNHEALTHY", 1), ("DEPLOY_FAILED", 1), ("UPDATING", 0), ("HEALTHY", 0)]:
        paths.observe({"Merged-7": status}, admin_marked=set())
        assert paths.choose(call(7), now=0) == "lora", status
    paths.observe({"Merged-7": ("UPDATING", 1)}, admin_marked=set())  # a RUNNING replica while updating
    assert paths.choose(call(7), now=0) == "merged"


def test_before_the_first_status_every_version_takes_lora():
    assert DedicatedPaths.of([PIRATE], 15).choose(call(7), now=0) == "lora"


def test_an_admin_unmark_stops_the_merged_path_a_config_mark_stays():
    paths = healthy_paths()
    paths.observe({"Merged-7": ("HEALTHY", 1), "Merged-9": ("HEALTHY", 1)}, admin_marked=set())
    assert paths.choose(call(9, sha="b" * 64), now=0) == "lora"
    assert paths.choose(call(7), now=0) == "merged"  # marked by the config
    paths = healthy_paths()
    paths.unmark(9)
    assert paths.choose(call(9, sha="b" * 64), now=0) == "lora"


def test_a_failed_call_backs_off_for_failure_backoff_s():
    paths = healthy_paths()
    paths.failed(7, now=100)
    assert paths.choose(call(7), now=114.9) == "lora"
    assert paths.choose(call(7), now=115) == "merged"


class FakeEngineClient:
    """A fake contract.EngineClient: yields `items`, or raises `error` before the first one."""

    def __init__(self, items=(), error=None):
        self.items, self.error, self.calls = list(items), error, []

    async def generate(self, call, request):
        self.calls.append(call)
        if self.error is not None:
            raise self.error
        for item in self.items:
            yield item

    async def base_models(self):
        return {"data": []}

    async def ready(self):
        return {"replica_id": "lora"}

    async def replica_status(self):
        return {}


def chunk(data: bytes) -> EngineChunk:
    return EngineChunk(data, 1, 0, 1)


def run(client, c):
    async def collect():
        return [item async for item in client.generate(c, request=None)]
    return asyncio.run(collect())


def test_the_merged_replica_gets_the_call_marked_merged_and_its_stream_passes_through():
    lora, merged = FakeEngineClient([chunk(b"lora")]), FakeEngineClient([chunk(b"m1"), chunk(b"m2")])
    client = PathChoosingEngineClient(lora, {7: merged}, healthy_paths(), clock=lambda: 0)
    assert [i.data for i in run(client, call(7))] == [b"m1", b"m2"]
    assert [c.path for c in merged.calls] == ["merged"] and lora.calls == []
    assert [i.data for i in run(client, call(8))] == [b"lora"]  # not dedicated
    assert lora.calls[0].path == "lora"


def test_a_lost_merged_replica_falls_back_to_lora_and_backs_off():
    lora, merged = FakeEngineClient([chunk(b"lora")]), FakeEngineClient(error=ConnectionError("actor died"))
    paths = healthy_paths()
    client = PathChoosingEngineClient(lora, {7: merged}, paths, clock=lambda: 50)
    assert [i.data for i in run(client, call(7))] == [b"lora"]
    assert lora.calls[0].path == "lora"  # billed as the LoRA path
    assert paths.failed_until[7] == 65
    assert [i.data for i in run(client, call(7))] == [b"lora"] and len(merged.calls) == 1  # backing off


def test_a_merged_replica_lost_mid_stream_raises_engine_lost_with_the_merged_call():
    from loraplex.contract import EngineLost

    class DiesAfterOneChunk(FakeEngineClient):
        async def generate(self, call, request):
            self.calls.append(call)
            yield chunk(b"m1")
            raise ConnectionError("actor died")

    lora = FakeEngineClient([chunk(b"lora")])
    client = PathChoosingEngineClient(lora, {7: DiesAfterOneChunk()}, healthy_paths(), clock=lambda: 0)
    received = []

    async def collect():
        async for item in client.generate(call(7), request=None):
            received.append(item.data)

    try:
        asyncio.run(collect())
    except EngineLost as lost:
        assert lost.call.path == "merged" and lost.call.adapter.lora_int_id == 7
        assert isinstance(lost.cause, ConnectionError)
    else:
        raise AssertionError("a mid-stream loss must end the stream with EngineLost")
    assert received == [b"m1"] and lora.calls == []  # not retried on LoRA: the client had a token


def test_a_wrong_path_refusal_falls_back_other_refusals_reach_the_client():
    wrong = EngineError(status=503, message="wrong", reason="wrong_path")
    lora = FakeEngineClient([chunk(b"lora")])
    client = PathChoosingEngineClient(lora, {7: FakeEngineClient([wrong])}, healthy_paths(), clock=lambda: 0)
    assert [i.data for i in run(client, call(7))] == [b"lora"]
    bad_request = EngineError(status=400, message="too long")
    client = PathChoosingEngineClient(lora, {7: FakeEngineClient([bad_request])}, healthy_paths(), clock=lambda: 0)
    assert run(client, call(7)) == [bad_request]


def test_the_fake_client_has_the_contract_s_shape():
    from loraplex.contract import EngineClient

    assert isinstance(FakeEngineClient(), EngineClient)
    assert isinstance(PathChoosingEngineClient(FakeEngineClient(), {}, healthy_paths()), EngineClient)


def test_a_dedicated_replica_serves_only_its_version_merged():
    assert path_refusal(PIRATE, call(7, path="merged")) is None
    for other in [call(7, path="lora"), call(8, path="merged"), call(7, sha="c" * 64, path="merged"),
                  call(7, tenant="ten_b", path="merged"), EngineCall(request_id="r", tenant_id="ten_a")]:
        refusal = path_refusal(PIRATE, other)
        assert refusal is not None and refusal.status == 503 and refusal.reason == "wrong_path", other


def test_a_lora_replica_refuses_a_merged_call_it_would_answer_as_the_base_model():
    assert path_refusal(None, call(7, path="lora")) is None
    assert path_refusal(None, EngineCall(request_id="r", tenant_id="ten_a", path="merged")) is None  # base model
    assert path_refusal(None, call(7, path="merged")).reason == "wrong_path"
