"""The Engine replica's metering path with the real classes, faked only at vLLM's edge.

What is real: the `Engine` Serve deployment class (coalescing, metering, error events), the
`VLLMEngine` around it (`generate` -> `_serve` -> `_run` -> `_finish`), `UsageTrackingAsyncLLM`
(`generate`, `_counted`, `record_output`), `LoadedAdapters`, `StreamBatcher` and the
`UsageLedger` with its spool and SQLite database.

What is fake, and named so:
- `FakeAsyncLLM`: vLLM's engine core. It sits *under* the real `UsageTrackingAsyncLLM`
  (`FakeAsyncLLMWithUsageTracking`), so every output it makes is counted by the real
  `UsageTrackingAsyncLLM.generate` and `record_output`, exactly as vLLM's outputs are.
  It yields real `vllm.outputs.RequestOutput`s as a `Script` says.
- `FakeChatServing` / `FakeCompletionServing`: vLLM's OpenAI serving layer. Like vLLM's, they
  call `llm.generate()` inside `create_*` (so the replica's current RequestUsage is bound
  there), then return an SSE generator ending with `data: [DONE]`, a response object, or an
  `ErrorResponse`.
- `FakeAdapterStore`, `FakeServingModels`: the registry's blob store and vLLM's model table.

Every metering test asserts on the rows the ledger wrote to its database.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Optional

import pytest
from sqlalchemy import select
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.entrypoints.openai.completion.protocol import CompletionRequest
from vllm.entrypoints.serve.engine.protocol import ErrorInfo, ErrorResponse
from vllm.exceptions import VLLMClientError, VLLMValidationError
from vllm.outputs import CompletionOutput, RequestOutput
from vllm.sampling_params import RequestOutputKind, SamplingParams
from vllm.v1.engine.async_llm import AsyncLLM

from loraplex.accounting.tables import usage_records
from loraplex.config import PlatformConfig
from loraplex.engine.deployment import Engine
from loraplex.engine.loaded_adapters import LoadedAdapters
from loraplex.contract import SSE_DONE, AdapterTarget, EngineCall, EngineChunk, EngineError, RequestUsage
from loraplex.engine.usage_tracking import UsageTrackingAsyncLLM
from loraplex.engine.vllm_engine import VLLMEngine, ending_status
from loraplex.registry.store import AdapterNotFound
from loraplex.store_io import AdapterStoreUnavailable

BASE_MODEL = "base-model"

DEADLINE_S = 5.0  # generous bound for every wait on a condition; tests finish far sooner


# --------------------------------------------------------------------------------------------
# Fakes at vLLM's edge
# --------------------------------------------------------------------------------------------
@dataclass
class Script:
    """What the fake engine core does with each engine request."""

    prompt_len: int = 7
    cached: int = 4
    tokens: int = 3  # completion tokens made when nothing goes wrong
    finish_reason: str = "stop"
    fail_after: Optional[int] = None  # raise after this many tokens (the engine died)
    stall_after: Optional[int] = None  # wait on FakeAsyncLLM.gate after this many tokens
    error_in_band: bool = False  # the serving layer turns a failure into an SSE error event, as vLLM does
    refuse: Optional[ErrorResponse] = None  # create_* returns this (e.g. prompt too long)
    invalid: Optional[str] = None  # create_* raises ValueError(invalid), as vLLM's validation does
    crash_in_create: bool = False  # create_* raises RuntimeError before any engine request
    reject_in_engine: bool = False  # AsyncLLM.add_request rejects it (VLLMValidationError), as vLLM v1 does


class FakeEngineDied(RuntimeError):
    """Stands in for vLLM's EngineDeadError: the engine core failed mid-request."""


class FakeAsyncLLM(AsyncLLM):
    """vLLM's engine core, faked: makes real RequestOutputs as `script` says. Never calls
    AsyncLLM.__init__ (no engine process)."""

    def __init__(self):  # noqa: D107 - deliberately not AsyncLLM.__init__
        self.script = Script()
        self.aborted: list[list[str]] = []
        self.removed_loras: list[int] = []
        self.added_loras: list[int] = []  # add_lora calls: loads into vLLM's host cache
        self.resident_loras: set[int] = set()  # vLLM's host cache (list_loras)
        self.slot_loras: list[int] = []  # vLLM's GPU slots, as our worker extension lists them
        self.pinned_loras: set[int] = set()
        self.lora_bytes = 1000  # each adapter's bytes in the CPU tier
        self.slot_loads = 0  # adapters moved into a slot, as our worker extension counts them
        self.generate_calls: list[tuple[str, SamplingParams, object]] = []
        self.unfinished: set[str] = set()
        self.stalled = asyncio.Event()  # set when a request reaches script.stall_after
        self.gate = asyncio.Event()  # a stalled request goes on when this is set
        self.shut_down = False

    async def generate(self, prompt, sampling_params, request_id, **kwargs):
        self.generate_calls.append((request_id, sampling_params, kwargs.get("lora_request")))
        s = self.script
        prompt_ids = list(range(100, 100 + s.prompt_len))
        kind = sampling_params.output_kind
        made: list[int] = []
        if s.reject_in_engine:  # vLLM validates in add_request, inside generate(): after it was called
            raise VLLMValidationError("max_tokens is too large", parameter="max_tokens")
        self.unfinished.add(request_id)
        try:
            for i in range(s.tokens):
                if s.stall_after is not None and i == s.stall_after:
                    self.stalled.set()
                    await self.gate.wait()
                if s.fail_after is not None and i == s.fail_after:
                    raise FakeEngineDied("engine core died")
                await asyncio.sleep(0)  # one decode step
                made.append(1000 + i)
                last = i == s.tokens - 1
                if kind == RequestOutputKind.FINAL_ONLY and not last:
                    continue
                new = [made[-1]] if kind == RequestOutputKind.DELTA else list(made)
                yield _request_output(request_id, prompt_ids, new, s.cached, s.finish_reason if last else None)
        finally:
            self.unfinished.discard(request_id)

    async def abort(self, request_id, internal: bool = False) -> None:
        ids = [request_id] if isinstance(request_id, str) else list(request_id)
        self.aborted.append(ids)
        self.unfinished.difference_update(ids)  # as vLLM's: the engine drops them at once

    def get_num_unfinished_requests(self) -> int:
        return len(self.unfinished)

    async def add_lora(self, lora_request) -> bool:
        self.added_loras.append(lora_request.lora_int_id)
        self.resident_loras.add(lora_request.lora_int_id)
        return True

    async def remove_lora(self, lora_id: int) -> bool:
        self.removed_loras.append(lora_id)
        self.resident_loras.discard(lora_id)
        self.pinned_loras.discard(lora_id)  # as vLLM's LRUCache.__delitem__
        return True

    async def list_loras(self) -> set[int]:
        return set(self.resident_loras)

    async def collective_rpc(self, method: str, timeout=None, args=(), kwargs=None):
        # Our worker extension's methods (loraplex.engine.lora_residency), over vLLM's state.
        from loraplex.engine.lora_residency import PIN_RPC, RPC, UNPIN_RPC
        if method == PIN_RPC:
            if args[0] not in self.resident_loras:
                raise ValueError(f"Cannot pin key: {args[0]} not in cache.")
            self.pinned_loras.add(args[0])
            return [True]
        if method == UNPIN_RPC:
            self.pinned_loras.discard(args[0])
            return [True]
        assert method == RPC, method
        return [{"slots": list(self.slot_loras), "cpu": sorted(self.resident_loras),
                 "pinned": sorted(self.pinned_loras), "cpu_bytes": {i: self.lora_bytes for i in self.resident_loras},
                 "slot_loads": self.slot_loads}]

    def shutdown(self, timeout=None) -> None:
        self.shut_down = True


class FakeAsyncLLMWithUsageTracking(UsageTrackingAsyncLLM, FakeAsyncLLM):
    """The real UsageTrackingAsyncLLM (generate, _counted, record_output) over the fake core:
    its `super().generate` is FakeAsyncLLM.generate."""


def _request_output(request_id, prompt_ids, token_ids, cached, finish_reason) -> RequestOutput:
    choice = CompletionOutput(index=0, text="".join(f"t{t}" for t in token_ids), token_ids=token_ids,
                              cumulative_logprob=None, logprobs=None, finish_reason=finish_reason)
    return RequestOutput(request_id=request_id, prompt=None, prompt_token_ids=prompt_ids,
                         prompt_logprobs=None, outputs=[choice], finished=finish_reason is not None,
                         num_cached_tokens=cached)


class FakeResponse:
    """A non-stream reply, like vLLM's pydantic ChatCompletionResponse."""

    def __init__(self, body: dict):
        self.body = body

    def model_dump(self, mode="python"):
        assert mode == "json"
        return self.body


def _sse(body: dict) -> str:
    # vLLM frames chunks with model_dump_json(): compact JSON.
    return f"data: {json.dumps(body, separators=(',', ':'))}\n\n"


class FakeOpenAIServing:
    """vLLM's OpenAIServingChat / OpenAIServingCompletion, faked at the same seam."""

    def __init__(self, llm: FakeAsyncLLM, models: "FakeServingModels"):
        self.llm = llm
        self.models = models
        self.requests: list = []

    def create_error_response(self, exc) -> ErrorResponse:
        return ErrorResponse(error=ErrorInfo(message=str(exc), type="BadRequestError", code=400))

    async def _create(self, request, prompts: list[str]):
        self.requests.append(request)
        s = self.llm.script
        if s.refuse is not None:
            return s.refuse
        if s.invalid is not None:
            raise ValueError(s.invalid)
        if s.crash_in_create:
            raise FakeEngineDied("tokenizer crashed")
        kind = RequestOutputKind.DELTA if request.stream else RequestOutputKind.FINAL_ONLY
        params = SamplingParams(max_tokens=16, output_kind=kind)
        lora = self.models.lora_requests.get(request.model)
        # As vLLM does: every engine request is started here, in the caller's context.
        gens = [self.llm.generate({"prompt": p}, params, f"cmpl-{request.request_id}-{i}", lora_request=lora)
                for i, p in enumerate(prompts)]
        if request.stream:
            return self._stream(request, gens)
        texts = []
        try:
            for g in gens:
                async for out in g:
                    texts.append(out.outputs[0].text)
        except VLLMClientError as exc:  # as vLLM's full generators do
            return self.create_error_response(exc)
        return FakeResponse({"id": request.request_id, "object": "chat.completion", "model": request.model,
                             "choices": [{"index": i, "text": t} for i, t in enumerate(texts)]})

    async def _stream(self, request, gens):
        try:
            for g in gens:
                async for out in g:
                    yield _sse({"id": request.request_id, "model": request.model,
                                "choices": [{"index": 0, "delta": {"content": out.outputs[0].text}}]})
        except FakeEngineDied as exc:
            if not self.llm.script.error_in_band:
                raise
            # vLLM's own stream generators end a failed stream with an error event and [DONE].
            yield _sse({"error": {"message": str(exc), "type": "InternalServerError", "code": 500}})
        except VLLMClientError as exc:
            yield _sse({"error": {"message": str(exc), "type": "BadRequestError", "code": 400}})
        yield SSE_DONE


class FakeChatServing(FakeOpenAIServing):
    async def create_chat_completion(self, request, raw_request=None):
        return await self._create(request, ["chat prompt"])


class FakeCompletionServing(FakeOpenAIServing):
    async def create_completion(self, request, raw_request=None):
        prompts = request.prompt if isinstance(request.prompt, list) else [request.prompt]
        return await self._create(request, prompts)


class FakeServingModels:
    """vLLM's OpenAIServingModels: only the `model` -> LoRARequest table LoadedAdapters fills."""

    def __init__(self):
        self.lora_requests: dict = {}

    async def show_available_models(self):
        return FakeResponse({"object": "list", "data": [{"id": BASE_MODEL}]})


class FakeAdapterStore:
    """The registry's blob store (blobs by tenant and sha256): blobs in `deleted` are gone."""

    def __init__(self, tmp_path):
        self.root = tmp_path / "fake-adapter-cache"
        self.deleted: set[tuple[str, str]] = set()  # (tenant, sha256)
        self.not_found_exc: type[Exception] = AdapterNotFound
        self.fetched: list[tuple[str, str]] = []
        self.evicted: list[tuple[str, str]] = []
        self.down = False  # the store does not answer: AdapterStore's bound ran out

    def fetch_to_local_cache(self, tenant, sha256):
        if self.down:
            raise AdapterStoreUnavailable("s3://fake-store", "this adapter version could not be loaded", timeout_s=1)
        if (tenant, sha256) in self.deleted:
            raise self.not_found_exc(f"adapter weights {sha256} not found for this tenant (deleted?)")
        self.fetched.append((tenant, sha256))
        return self.root / tenant / sha256

    def evict_from_local_cache(self, tenant, sha256):
        self.evicted.append((tenant, sha256))


class VLLMEngineOverFakeVLLM(VLLMEngine):
    """The real VLLMEngine; only start() differs: it wires the fakes instead of starting vLLM."""

    fake_store: FakeAdapterStore  # set by the fixture

    async def start(self) -> None:
        self.llm = FakeAsyncLLMWithUsageTracking()
        self.models = FakeServingModels()
        self.chat_serving = FakeChatServing(self.llm, self.models)
        self.completion_serving = FakeCompletionServing(self.llm, self.models)
        self.adapters = LoadedAdapters(self.llm, self.models, self.fake_store, self.metrics,
                                       residency=self.lora_residency, max_cpu_bytes=self.config.max_cpu_lora_bytes)
        self._residency_rpc = True  # as start() sets it with our worker extension


# --------------------------------------------------------------------------------------------
# Fixtures and helpers
# --------------------------------------------------------------------------------------------
def make_config(tmp_path, **deployment) -> PlatformConfig:
    return PlatformConfig.from_args({
        "database_url": f"sqlite:///{tmp_path}/db.sqlite",
        "engine": {"served_model_name": BASE_MODEL},
        "registry": {"store_url": str(tmp_path / "store"), "cache_dir": str(tmp_path / "cache")},
        "accounting": {"spool_dir": str(tmp_path / "spool")},
        "engine_deployment": deployment,
    })


async def start_replica(tmp_path, engine_config: dict | None = None, stopping=None, **deployment) -> Engine:
    store = FakeAdapterStore(tmp_path)
    engine_cls = type("VLLMEngineOverFakeVLLM", (VLLMEngineOverFakeVLLM,), {"fake_store": store})
    engine = Engine.__new__(Engine)
    config = make_config(tmp_path, **deployment)
    if engine_config:
        config = config.model_copy(update={"engine": config.engine.model_copy(update=engine_config)})
    await engine.__init__(config, engine_cls=engine_cls, stopping=stopping)
    return engine


@pytest.fixture
async def replica(tmp_path):
    engine = await start_replica(tmp_path)
    yield engine
    await engine.__del__()


def llm(replica: Engine) -> FakeAsyncLLM:
    return replica.engine.llm


def ledger_rows(replica: Engine) -> list[dict]:
    replica.ledger.flush()
    with replica.ledger.engine.connect() as conn:
        return [r._asdict() for r in conn.execute(select(usage_records).order_by(usage_records.c.request_id))]


def tokens(row: dict) -> tuple[int, int, int]:
    return row["prompt_tokens"], row["cached_prompt_tokens"], row["completion_tokens"]


# The client pinned version 2 ("bot@2"): replies echo that, never the internal lora_name.
ADAPTER = AdapterTarget("ten_a/bot@abc", 7, "ten_a", "bot", "abc", requested_as="bot@2", version=2)


def make_call(request_id="req-1", tenant="ten_a", adapter: Optional[AdapterTarget] = None, stream=True,
              **kw) -> EngineCall:
    return EngineCall(request_id=request_id, tenant_id=tenant, api_key_id="key_1" if tenant else None,
                      adapter=adapter, cache_salt=f"salt:{tenant}" if tenant else None,
                      arrival_time=time.time() - 1.0, stream=stream,
                      routing_key=(f"{tenant}/{adapter.name}" if adapter else tenant) if tenant else None, **kw)


def chat(stream=True, model=BASE_MODEL) -> ChatCompletionRequest:
    return ChatCompletionRequest(model=model, messages=[{"role": "user", "content": "hi"}], stream=stream)


async def drain(gen) -> list:
    return [item async for item in gen]


def sse_events(chunks: list[EngineChunk]) -> list[str]:
    text = b"".join(c.data for c in chunks).decode()
    return [e for e in text.split("\n\n") if e]


async def wait_for(predicate, what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)


# --------------------------------------------------------------------------------------------
# (a) a stream that finishes
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("finish_reason", ["stop", "length"])
async def test_a_finished_stream_is_metered_once_before_its_last_chunk_leaves(replica, finish_reason):
    llm(replica).script = Script(prompt_len=7, cached=4, tokens=5, finish_reason=finish_reason)
    spool = replica.ledger.spool
    chunks, appended_when_received = [], []
    async for chunk in replica.generate(make_call(), chat()):
        chunks.append(chunk)
        appended_when_received.append(spool.appended)
    assert all(isinstance(c, EngineChunk) for c in chunks)
    assert chunks[-1].data.endswith(SSE_DONE.encode())
    # The record was spooled before the chunk carrying [DONE] left, and not before.
    assert appended_when_received[-1] == 1
    assert all(n == 0 for n in appended_when_received[:-1])
    # Only the metered last chunk is final: the ingress frees the admission on it.
    assert chunks[-1].final and not any(c.final for c in chunks[:-1])
    events = sse_events(chunks)
    assert events[-1] == "data: [DONE]" and sum(e.startswith('data: {"id"') for e in events) == 5
    last = chunks[-1]
    assert (last.prompt_tokens, last.cached_prompt_tokens, last.completion_tokens) == (7, 4, 5)

    rows = ledger_rows(replica)
    assert len(rows) == 1
    row = rows[0]
    assert row["request_id"] == "req-1" and row["tenant_id"] == "ten_a" and row["api_key_id"] == "key_1"
    assert row["status"] == finish_reason and row["base_model"] == BASE_MODEL and row["adapter"] is None
    assert tokens(row) == (7, 4, 5) and row["replica_id"] == "local"
    assert row["ttft"] == pytest.approx(1.0, abs=0.5)
    assert llm(replica).aborted == []  # finished on its own: nothing to abort


async def test_the_request_reaches_vllm_with_its_id_and_tenant_salt(replica):
    await drain(replica.generate(make_call("req-salt"), chat()))
    request = replica.engine.chat_serving.requests[-1]
    assert request.request_id == "req-salt" and request.cache_salt == "salt:ten_a"


async def test_the_request_carries_its_tenant_and_weight_to_the_tenant_scheduler_over_the_clients(replica):
    request = chat()
    request.vllm_xargs = {"loraplex_tenant": "ten_other", "loraplex_weight": 100.0, "loraplex_batch": True,
                          "theirs": 1}  # a client's own
    await drain(replica.generate(make_call("req-who", weight=2.0), request))
    sent = replica.engine.chat_serving.requests[-1].vllm_xargs
    assert sent == {"loraplex_tenant": "ten_a", "loraplex_weight": 2.0, "loraplex_batch": False, "theirs": 1}


async def test_a_batch_line_is_metered_as_batch_and_tells_the_tenant_scheduler(replica):
    await drain(replica.generate(make_call("batch_x-0", stream=False, batch=True), chat(stream=False)))
    await drain(replica.generate(make_call("online-1", stream=False), chat(stream=False)))
    assert replica.engine.chat_serving.requests[-2].vllm_xargs["loraplex_batch"] is True
    assert {r["request_id"]: r["batch"] for r in ledger_rows(replica)} == {"batch_x-0": True, "online-1": False}


async def test_a_call_for_another_base_is_refused_unrun_and_unbilled(replica):
    """Each base has its own pool: a call that names another base (a wiring bug) never runs here,
    where its adapter's weights do not belong; its own base's call runs and is billed under it."""
    items = await drain(replica.generate(make_call("req-other", base_model="other-base"), chat()))
    assert len(items) == 1 and isinstance(items[0], EngineError) and items[0].status == 500
    assert "other-base" in items[0].message and items[0].reason == "wrong_base"
    assert replica.engine.chat_serving.requests == [] and ledger_rows(replica) == []
    await drain(replica.generate(make_call("req-own", base_model=BASE_MODEL), chat()))
    assert [(r["request_id"], r["base_model"]) for r in ledger_rows(replica)] == [("req-own", BASE_MODEL)]


async def test_a_stream_with_an_adapter_runs_its_lora_and_echoes_the_name_the_client_used(replica):
    llm(replica).script = Script(tokens=4)
    chunks = await drain(replica.generate(make_call(adapter=ADAPTER), chat(model="bot@2")))
    text = b"".join(c.data for c in chunks).decode()
    assert '"model":"bot@2"' in text and ADAPTER.lora_name not in text
    _, _, lora = llm(replica).generate_calls[-1]
    assert lora.lora_name == ADAPTER.lora_name and lora.lora_int_id == ADAPTER.lora_int_id
    assert replica.engine.adapters.in_flight[ADAPTER.lora_name] == 0  # released
    [row] = ledger_rows(replica)
    assert row["adapter"] == "bot@2" and row["status"] == "stop" and row["completion_tokens"] == 4


@pytest.mark.parametrize("window_s", [0.0, 0.05])
async def test_a_batched_completion_sums_its_engine_requests(tmp_path, window_s):
    replica = await start_replica(tmp_path, stream_window_s=window_s)
    try:
        llm(replica).script = Script(prompt_len=6, cached=2, tokens=3)
        request = CompletionRequest(model=BASE_MODEL, prompt=["one", "two"], stream=True)
        chunks = await drain(replica.generate(make_call("req-batch"), request))
        assert chunks[-1].data.endswith(SSE_DONE.encode())
        [row] = ledger_rows(replica)
        assert tokens(row) == (12, 4, 6) and row["status"] == "stop"
    finally:
        await replica.__del__()


# --------------------------------------------------------------------------------------------
# (b) a non-stream request
# --------------------------------------------------------------------------------------------
async def test_a_non_stream_reply_is_one_json_chunk_metered_once(replica):
    llm(replica).script = Script(prompt_len=9, cached=0, tokens=6, finish_reason="length")
    chunks = await drain(replica.generate(make_call(adapter=ADAPTER, stream=False), chat(stream=False, model="bot@2")))
    assert len(chunks) == 1 and isinstance(chunks[0], EngineChunk)
    body = json.loads(chunks[0].data)
    assert body["model"] == "bot@2" and body["id"] == "req-1"  # the name the client asked for
    assert (chunks[0].prompt_tokens, chunks[0].completion_tokens) == (9, 6)
    [row] = ledger_rows(replica)
    assert row["status"] == "length" and tokens(row) == (9, 0, 6) and row["adapter"] == "bot@2"


# --------------------------------------------------------------------------------------------
# (c) the client goes away mid-stream
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("window_s", [0.0, 0.05])
async def test_a_client_disconnect_aborts_the_engine_request_and_bills_what_was_generated(tmp_path, window_s):
    replica = await start_replica(tmp_path, stream_window_s=window_s)
    try:
        fake = llm(replica)
        fake.script = Script(prompt_len=5, cached=0, tokens=50, stall_after=3)
        gen = replica.generate(make_call("req-gone"), chat())
        first = await gen.__anext__()
        assert isinstance(first, EngineChunk) and first.data.count(b'"delta"') == 1  # never held back
        received = first.data.count(b'"delta"')
        while received < 3:  # the client reads every token made before the engine stalls
            received += (await asyncio.wait_for(gen.__anext__(), DEADLINE_S)).data.count(b'"delta"')
        assert received == 3
        # 3 tokens made and sent, the 4th is pending: the client goes away.
        await gen.aclose()
        # The engine request is aborted by the time the client's stream is closed: not at GC.
        assert fake.aborted == [["cmpl-req-gone-0"]]
        assert fake.get_num_unfinished_requests() == 0
        assert replica.batcher.active_streams == 0
        [row] = ledger_rows(replica)
        assert row["request_id"] == "req-gone" and row["status"] == "client_disconnect"
        assert tokens(row) == (5, 0, 3)
    finally:
        await replica.__del__()


async def test_a_disconnect_aborts_every_engine_request_of_a_batched_completion(replica):
    fake = llm(replica)
    fake.script = Script(prompt_len=4, cached=0, tokens=10, stall_after=2)
    gen = replica.generate(make_call("req-b"), CompletionRequest(model=BASE_MODEL, prompt=["a", "b"], stream=True))
    await gen.__anext__()
    await asyncio.wait_for(fake.stalled.wait(), DEADLINE_S)
    await gen.aclose()
    assert fake.aborted == [["cmpl-req-b-0", "cmpl-req-b-1"]]
    [row] = ledger_rows(replica)
    # Both engine requests were started (prompts counted once each); the first made 2 tokens.
    assert row["status"] == "client_disconnect" and tokens(row) == (4, 0, 2)


# --------------------------------------------------------------------------------------------
# (d) the engine fails after the request started
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("window_s", [0.0, 0.05])
async def test_an_engine_failure_mid_stream_ends_with_an_error_event_and_bills_the_tokens(tmp_path, window_s):
    replica = await start_replica(tmp_path, stream_window_s=window_s)
    try:
        fake = llm(replica)
        fake.script = Script(prompt_len=8, cached=2, tokens=10, fail_after=4)
        chunks = await drain(replica.generate(make_call("req-died"), chat()))
        assert all(isinstance(c, EngineChunk) for c in chunks)
        events = sse_events(chunks)
        # Every token the engine made reached the client, then an error event, then the end.
        assert sum('"delta"' in e for e in events) == 4
        assert events[-1] == "data: [DONE]"
        error = json.loads(events[-2][len("data: "):])["error"]
        assert error["code"] == 503 and "FakeEngineDied" in error["message"]
        assert chunks[-1].data.endswith(b"data: [DONE]\n\n") and b'"error"' in chunks[-1].data
        assert chunks[-1].completion_tokens == 4
        [row] = ledger_rows(replica)
        assert row["status"] == "engine_error" and tokens(row) == (8, 2, 4)
        assert fake.aborted == [["cmpl-req-died-0"]]
    finally:
        await replica.__del__()


async def test_a_failure_vllm_reports_in_band_is_billed_as_an_engine_error(replica):
    # vLLM's own stream generator turns an engine exception into an error event + [DONE]: the
    # stream "ends", but with no finish reason, which is an engine error, not a finish.
    llm(replica).script = Script(prompt_len=8, cached=0, tokens=10, fail_after=2, error_in_band=True)
    chunks = await drain(replica.generate(make_call("req-inband"), chat()))
    events = sse_events(chunks)
    assert events[-1] == "data: [DONE]" and '"error"' in events[-2]
    [row] = ledger_rows(replica)
    assert row["status"] == "engine_error" and tokens(row) == (8, 0, 2)


async def test_an_engine_failure_in_a_non_stream_request_is_a_billed_503(replica):
    llm(replica).script = Script(prompt_len=8, cached=0, tokens=10, fail_after=4)
    items = await drain(replica.generate(make_call("req-ns-died", stream=False), chat(stream=False)))
    assert len(items) == 1 and isinstance(items[0], EngineError)
    error = items[0]
    assert error.status == 503 and error.billed is True and error.type == "ServiceUnavailableError"
    assert error.body()["error"]["code"] == 503
    [row] = ledger_rows(replica)
    # A non-stream request is FINAL_ONLY in vLLM: no output was reported, the client got nothing.
    assert row["status"] == "engine_error" and row["completion_tokens"] == 0


async def test_a_failure_before_any_engine_request_is_an_unbilled_503(replica):
    llm(replica).script = Script(crash_in_create=True)
    items = await drain(replica.generate(make_call("req-nothing"), chat()))
    assert len(items) == 1 and isinstance(items[0], EngineError)
    assert items[0].status == 503 and items[0].billed is False
    assert ledger_rows(replica) == []


# --------------------------------------------------------------------------------------------
# The call's deadline
# --------------------------------------------------------------------------------------------
async def test_a_stream_past_its_deadline_is_cut_with_a_504_event_and_billed_as_timeout(replica):
    fake = llm(replica)
    fake.script = Script(prompt_len=6, cached=0, tokens=50, stall_after=2)
    call = make_call("req-slow", deadline=time.time() + 0.3)
    chunks = await asyncio.wait_for(drain(replica.generate(call, chat())), DEADLINE_S)
    events = sse_events(chunks)
    assert sum('"delta"' in e for e in events) == 2  # what was made before the deadline went out
    assert events[-1] == "data: [DONE]"
    assert json.loads(events[-2][len("data: "):])["error"]["code"] == 504
    assert fake.aborted == [["cmpl-req-slow-0"]] and fake.get_num_unfinished_requests() == 0
    [row] = ledger_rows(replica)
    assert row["status"] == "timeout" and tokens(row) == (6, 0, 2)


async def test_a_non_stream_request_past_its_deadline_is_a_billed_504(replica):
    fake = llm(replica)
    fake.script = Script(prompt_len=6, cached=0, tokens=50, stall_after=2)
    call = make_call("req-slow-ns", stream=False, deadline=time.time() + 0.3)
    items = await asyncio.wait_for(drain(replica.generate(call, chat(stream=False))), DEADLINE_S)
    assert len(items) == 1 and isinstance(items[0], EngineError)
    assert items[0].status == 504 and items[0].billed is True
    assert fake.aborted == [["cmpl-req-slow-ns-0"]]
    [row] = ledger_rows(replica)
    assert row["status"] == "timeout"
    assert "ask for fewer tokens," in items[0].message


async def test_a_wide_request_past_its_deadline_is_told_its_sequences_too(replica):
    # n choices: "fewer tokens" alone would never mention what made it long (issue 46).
    llm(replica).script = Script(prompt_len=6, cached=0, tokens=50, stall_after=2)
    call = make_call("req-wide-ns", stream=False, deadline=time.time() + 0.3, sequences=4)
    [item] = await asyncio.wait_for(drain(replica.generate(call, chat(stream=False))), DEADLINE_S)
    assert item.status == 504 and "fewer tokens or fewer sequences (n x prompts: 4)" in item.message


# --------------------------------------------------------------------------------------------
# (e) refusals are not billed
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("stream", [True, False])
async def test_an_error_response_is_one_engine_error_and_no_record(replica, stream):
    too_long = ErrorResponse(error=ErrorInfo(message="This model's maximum context length is 2048 tokens",
                                             type="BadRequestError", param="messages", code=400))
    llm(replica).script = Script(refuse=too_long)
    items = await drain(replica.generate(make_call("req-refused", stream=stream), chat(stream=stream)))
    assert items == [EngineError(status=400, message="This model's maximum context length is 2048 tokens",
                                 type="BadRequestError", param="messages")]
    assert items[0].billed is False
    assert ledger_rows(replica) == []
    assert llm(replica).aborted == []


async def test_a_validation_error_becomes_the_servings_error_response_and_no_record(replica):
    llm(replica).script = Script(invalid="temperature must be >= 0")
    items = await drain(replica.generate(make_call("req-invalid"), chat()))
    assert len(items) == 1 and isinstance(items[0], EngineError)
    assert items[0].status == 400 and "temperature" in items[0].message and not items[0].billed
    assert ledger_rows(replica) == []


async def test_a_non_stream_request_vllm_rejects_after_generate_was_called_is_not_billed(replica):
    # The engine request id is already known (generate() was called), yet no token was made:
    # it is still a refusal.
    llm(replica).script = Script(reject_in_engine=True)
    items = await drain(replica.generate(make_call("req-rejected", stream=False), chat(stream=False)))
    assert len(items) == 1 and isinstance(items[0], EngineError)
    assert items[0].status == 400 and "max_tokens" in items[0].message and not items[0].billed
    assert ledger_rows(replica) == []


async def test_a_stream_vllm_rejects_after_generate_was_called_is_not_billed(replica):
    """vLLM validates some parameters inside add_request and reports it in-band (an error event,
    then [DONE]): a refusal, passed on as an EngineError with vLLM's status, and never billed."""
    llm(replica).script = Script(reject_in_engine=True)
    items = await drain(replica.generate(make_call("req-rejected"), chat()))
    assert len(items) == 1 and isinstance(items[0], EngineError) and items[0].status == 400
    assert not items[0].billed
    assert ledger_rows(replica) == []


async def test_an_overloaded_replica_sheds_low_priority_first_and_bills_nothing(replica):
    replica.in_flight.add("ten_a", 1.0, 40)  # as if 40 of ten_a's ran here: p0 is shed at 48... so lower the bar
    replica.shedder.config = replica.shedder.config.model_copy(update={"shed_requests": 16, "max_requests": 64})
    low = await drain(replica.generate(make_call("req-low", priority=0), chat()))
    assert len(low) == 1 and isinstance(low[0], EngineError) and low[0].status == 503
    assert low[0].retry_after == replica.shedder.config.retry_after_s and not low[0].billed
    high = await drain(replica.generate(make_call("req-high", priority=90), chat()))
    assert high[-1].data.endswith(SSE_DONE.encode())
    assert replica.in_flight.total == 40  # the served request was counted and released
    assert [r["request_id"] for r in ledger_rows(replica)] == ["req-high"]


# --------------------------------------------------------------------------------------------
# (f) no tenant, no record
# --------------------------------------------------------------------------------------------
async def test_a_call_without_a_tenant_is_served_and_not_metered(replica):
    chunks = await drain(replica.generate(EngineCall(request_id="req-open", tenant_id=None, stream=True), chat()))
    assert chunks[-1].data.endswith(SSE_DONE.encode()) and chunks[-1].completion_tokens == 3
    assert ledger_rows(replica) == [] and replica.ledger.spool.appended == 0


# --------------------------------------------------------------------------------------------
# (g) deleted adapters
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("not_found", [AdapterNotFound, FileNotFoundError])
async def test_an_adapter_deleted_before_the_run_is_a_404_refusal(replica, not_found):
    store = replica.engine.adapters.store
    store.deleted.add((ADAPTER.tenant, ADAPTER.sha256))
    store.not_found_exc = not_found
    items = await drain(replica.generate(make_call("req-deleted", adapter=ADAPTER), chat(model="bot@2")))
    assert len(items) == 1 and isinstance(items[0], EngineError)
    assert items[0].status == 404 and items[0].type == "NotFoundError" and not items[0].billed
    assert "`bot@2`" in items[0].message
    assert ledger_rows(replica) == [] and llm(replica).generate_calls == []
    assert ADAPTER.lora_name not in replica.engine.models.lora_requests


async def test_an_uncached_version_while_the_store_is_down_is_a_503_refusal_and_loads_once_it_is_back(replica):
    store = replica.engine.adapters.store
    store.down = True
    items = await drain(replica.generate(make_call("req-down", adapter=ADAPTER), chat(model="bot@2")))
    assert len(items) == 1 and isinstance(items[0], EngineError)
    refusal = items[0]
    assert refusal.status == 503 and not refusal.billed and refusal.retry_after == 10
    assert refusal.reason == "adapter_store_unavailable" and "s3://fake-store" in refusal.message
    assert ledger_rows(replica) == [] and llm(replica).generate_calls == []
    store.down = False  # back: the next request loads it, no restart
    items = await drain(replica.generate(make_call("req-back", adapter=ADAPTER), chat(model="bot@2")))
    assert all(isinstance(c, EngineChunk) for c in items) and store.fetched == [(ADAPTER.tenant, ADAPTER.sha256)]
    store.down = True  # down again: the loaded version is served without the store
    items = await drain(replica.generate(make_call("req-cached", adapter=ADAPTER), chat(model="bot@2")))
    assert all(isinstance(c, EngineChunk) for c in items)


async def test_deleting_an_adapter_lets_running_requests_finish_and_404s_later_ones(replica):
    fake, adapters = llm(replica), replica.engine.adapters
    fake.script = Script(prompt_len=5, cached=0, tokens=6, stall_after=2)
    running = replica.generate(make_call("req-running", adapter=ADAPTER), chat(model="bot@2"))
    got = [await running.__anext__()]
    await asyncio.wait_for(fake.stalled.wait(), DEADLINE_S)

    await adapters.retire({ADAPTER.lora_int_id})  # DELETE noticed while a request runs with it
    assert ADAPTER.lora_int_id in adapters.deleted and fake.removed_loras == []
    later = await drain(replica.generate(make_call("req-later", adapter=ADAPTER), chat(model="bot@2")))
    assert len(later) == 1 and isinstance(later[0], EngineError) and later[0].status == 404

    fake.gate.set()
    got += [c async for c in running]
    assert got[-1].data.endswith(SSE_DONE.encode())
    # Its last request done, the version is freed.
    assert fake.removed_loras == [ADAPTER.lora_int_id] and adapters.targets == {}
    assert replica.engine.adapters.store.evicted == [(ADAPTER.tenant, ADAPTER.sha256)]

    replica.engine.adapters.store.deleted.add((ADAPTER.tenant, ADAPTER.sha256))  # the blob is gone too
    after = await drain(replica.generate(make_call("req-after", adapter=ADAPTER), chat(model="bot@2")))
    assert len(after) == 1 and isinstance(after[0], EngineError) and after[0].status == 404

    rows = ledger_rows(replica)
    assert [(r["request_id"], r["status"], r["completion_tokens"]) for r in rows] == [("req-running", "stop", 6)]


async def test_a_version_retired_while_idle_is_never_reloaded(replica):
    await drain(replica.generate(make_call("req-before", adapter=ADAPTER), chat(model="bot@2")))
    await replica.engine.adapters.retire({ADAPTER.lora_int_id})  # idle: dropped at once
    assert llm(replica).removed_loras == [ADAPTER.lora_int_id]
    # The blob is not removed yet (DELETE marks the catalog row first, then deletes the blob).
    later = await drain(replica.generate(make_call("req-later", adapter=ADAPTER), chat(model="bot@2")))
    assert len(later) == 1 and isinstance(later[0], EngineError) and later[0].status == 404


# --------------------------------------------------------------------------------------------
# (h) served keys, routing stats, health checks
# --------------------------------------------------------------------------------------------
async def test_served_keys_record_the_calls_routing_key(replica):
    await drain(replica.generate(make_call("r1", adapter=ADAPTER), chat(model="bot@2")))
    await drain(replica.generate(make_call("r2", tenant="ten_b"), chat()))
    await drain(replica.generate(EngineCall(request_id="r3", stream=True), chat()))  # no key: not recorded
    assert replica.served_keys.recent() == ["ten_b", "ten_a/bot"]


async def test_routing_stats_report_the_keys_served_most_recent_first(replica):
    for i, (tenant, adapter) in enumerate((("ten_a", None), ("ten_b", ADAPTER), ("ten_a", None))):
        await drain(replica.generate(make_call(f"r-{i}", tenant=tenant, adapter=adapter), chat()))
    stats = await replica.record_routing_stats()
    assert stats["held_keys"] == ["ten_a", "ten_b/bot"]
    assert {"running", "waiting", "kv_usage"} <= set(stats)


async def test_routing_stats_say_where_vllm_holds_each_adapter_and_its_demand(replica):
    """GPU slots (through the worker extension's collective_rpc) and CPU tier by affinity key,
    the slot count, and a decayed count of requests per adapter; base requests add no demand."""
    other = AdapterTarget("ten_a/other@1:def", 8, "ten_a", "other", "def", requested_as="other", version=1)
    for i, adapter in enumerate((ADAPTER, ADAPTER, other, None)):
        await drain(replica.generate(make_call(f"r-{i}", adapter=adapter), chat()))
    llm(replica).slot_loras = [ADAPTER.lora_int_id]  # `other` is in the CPU tier only
    adapters = (await replica.record_routing_stats())["adapters"]
    assert (adapters["slots"], adapters["cpu"], adapters["max_loras"]) == (["ten_a/bot"], ["ten_a/bot", "ten_a/other"], 4)
    assert adapters["demand"]["ten_a/bot"] == pytest.approx(2, abs=0.01)
    assert adapters["demand"]["ten_a/other"] == pytest.approx(1, abs=0.01) and "ten_a" not in adapters["demand"]


async def test_unfinished_requests_and_loaded_adapters_come_from_the_engine(replica):
    fake = llm(replica)
    fake.script = Script(tokens=5, stall_after=1)
    gen = replica.generate(make_call(adapter=ADAPTER), chat(model="bot@2"))
    await gen.__anext__()
    await asyncio.wait_for(fake.stalled.wait(), DEADLINE_S)
    assert replica.num_unfinished_requests() == 1
    assert replica.loaded_adapters() == [ADAPTER.lora_name]
    fake.gate.set()
    await drain(gen)
    assert replica.num_unfinished_requests() == 0


async def test_health_check_probes_only_when_nothing_proved_the_engine_lately(replica):
    fake = llm(replica)
    await replica.check_health()
    assert replica.engine.probes_done == 1
    probe_id, params, _ = fake.generate_calls[-1]
    assert probe_id.startswith("probe-") and params.max_tokens == 1
    await replica.check_health()  # the probe itself is recent progress
    assert replica.engine.probes_done == 1
    replica.engine.last_probe_ok = time.time() - replica.ready_probe_max_age_s
    await replica.check_health()
    assert replica.engine.probes_done == 2
    # Real traffic is progress too: no probe while requests are being served.
    replica.engine.last_probe_ok = time.time() - replica.ready_probe_max_age_s
    await drain(replica.generate(make_call(), chat()))
    await replica.check_health()
    assert replica.engine.probes_done == 2
    assert ledger_rows(replica)[0]["request_id"] == "req-1"  # probes are never billed
    assert len(ledger_rows(replica)) == 1


# --------------------------------------------------------------------------------------------
# The metering path never loses a record
# --------------------------------------------------------------------------------------------
async def test_a_record_the_spool_refuses_is_kept_retried_and_written_once(replica, monkeypatch):
    ledger = replica.ledger
    spool_append = ledger.spool.append
    failing = {"on": True, "calls": 0}

    def append(entry, fresh_line=False):
        if failing["on"]:
            failing["calls"] += 1
            raise OSError(28, "No space left on device")
        spool_append(entry, fresh_line=fresh_line)

    monkeypatch.setattr(ledger.spool, "append", append)
    chunks = await drain(replica.generate(make_call("req-disk-full"), chat()))
    assert chunks[-1].data.endswith(SSE_DONE.encode())  # the client is served; append did not raise
    assert failing["calls"] >= 1 and isinstance(ledger.last_error, OSError)
    assert ledger.retry_unspooled() == 1  # still held while the disk refuses it
    rows = ledger_rows(replica)  # the flush writes it into the database directly
    assert [(r["request_id"], r["status"], tokens(r)) for r in rows] == [("req-disk-full", "stop", (7, 4, 3))]
    assert ledger.unspooled_records() == 0

    failing["on"] = False
    assert ledger.retry_unspooled() == 0 and len(ledger_rows(replica)) == 1


async def test_every_ending_writes_exactly_one_record_per_request(replica):
    """One replica, one request of each kind of ending: one row each, none for refusals."""
    fake = llm(replica)
    fake.script = Script(tokens=3)
    await drain(replica.generate(make_call("r-stop"), chat()))
    fake.script = Script(tokens=3, finish_reason="length")
    await drain(replica.generate(make_call("r-length", stream=False), chat(stream=False)))
    fake.script = Script(tokens=9, fail_after=2)
    await drain(replica.generate(make_call("r-died"), chat()))
    fake.script = Script(refuse=ErrorResponse(error=ErrorInfo(message="no", type="BadRequestError", code=400)))
    await drain(replica.generate(make_call("r-refused"), chat()))
    fake.script = Script(crash_in_create=True)
    await drain(replica.generate(make_call("r-crashed"), chat()))
    await drain(replica.generate(EngineCall(request_id="r-open", stream=True), chat()))
    rows = ledger_rows(replica)
    assert {r["request_id"]: r["status"] for r in rows} == {
        "r-stop": "stop", "r-length": "length", "r-died": "engine_error"}
    # (Client disconnects: see test_a_client_disconnect_aborts_the_engine_request_and_bills_what_was_generated.)


# --------------------------------------------------------------------------------------------
# Pure helpers
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("finish_reason, ending, status", [
    ("stop", "engine_error", "stop"), ("length", "engine_error", "length"), ("abort", "engine_error", "aborted"),
    (None, "client_disconnect", "client_disconnect"), (None, "engine_error", "engine_error"),
    ("tool_calls", "engine_error", "finished"),
])
def test_ending_status(finish_reason, ending, status):
    assert ending_status(finish_reason, ending) == status


def test_usage_record_times_are_utc():
    from loraplex.engine.metering import usage_record

    t = datetime(2026, 11, 30, 12, tzinfo=timezone.utc).timestamp()
    call = EngineCall(request_id="r", tenant_id="t", api_key_id="k", adapter=ADAPTER, arrival_time=t)
    usage = RequestUsage(prompt_tokens=5, completion_tokens=2, finish_reason="stop", replica_id="rep",
                         first_token_time=t + 0.25, finish_time=t + 1, status="stop")
    rec = usage_record(call, usage, "base")
    assert rec.arrival_time.tzinfo is not None and rec.finish_time - rec.arrival_time == timedelta(seconds=1)
    assert rec.ttft == pytest.approx(0.25)
    assert (rec.adapter, rec.api_key_id, rec.base_model, rec.replica_id) == ("bot@2", "k", "base", "rep")


# --------------------------------------------------------------------------------------------
# (i) pinning and the CPU tier's byte budget
# --------------------------------------------------------------------------------------------
def target(n: int) -> AdapterTarget:
    return AdapterTarget(f"ten_a/a{n}@1:s{n}", 100 + n, "ten_a", f"a{n}", f"s{n}", requested_as=f"a{n}", version=1)


async def use(replica, t: AdapterTarget) -> None:
    await drain(replica.generate(make_call(f"use-{t.name}-{len(llm(replica).added_loras)}", adapter=t), chat()))


async def test_a_pinned_version_is_loaded_and_pinned_at_once_and_unpinned_when_the_catalog_says(replica):
    adapters, fake = replica.engine.adapters, llm(replica)
    await adapters.sync_pins([target(1)])
    assert fake.added_loras == [101] and fake.pinned_loras == {101} == adapters.pinned
    fake.slot_loads = 3
    await replica.record_routing_stats()  # samples vLLM's tiers: GET /admin/replicas shows the pin
    status = replica.replica_status()
    assert status["pinned_adapters"] == [target(1).lora_name] and status["adapter_cpu_bytes"] == 1000
    assert status["slot_loads"] == 3
    await adapters.sync_pins([target(1)])  # a second sync changes nothing
    assert fake.added_loras == [101]
    fake.resident_loras.discard(101)  # vLLM lost it (a restart of its worker): reloaded and pinned again
    fake.pinned_loras.discard(101)
    adapters.note_resident(set(fake.resident_loras))
    await adapters.sync_pins([target(1)])
    assert fake.added_loras == [101, 101] and fake.pinned_loras == {101}
    await adapters.sync_pins([])
    assert fake.pinned_loras == set() == adapters.pinned and 101 in fake.resident_loras  # unpinned, still loaded


async def test_the_byte_budget_removes_least_recently_used_idle_unpinned_versions(tmp_path):
    """max_cpu_lora_bytes = 3 adapters of 1000 bytes: a fourth load removes the least recently
    used one that is not pinned, which loads again on its next use; without a budget nothing goes."""
    replica = await start_replica(tmp_path, engine_config={"max_cpu_lora_bytes": 3000})
    try:
        adapters, fake = replica.engine.adapters, llm(replica)
        assert adapters.max_cpu_bytes == 3000
        await adapters.sync_pins([target(1)])  # pinned first, so the oldest
        for n in (2, 3, 4):
            await use(replica, target(n))
        assert fake.resident_loras == {101, 103, 104} and fake.removed_loras == [102]
        assert target(2).lora_name in adapters.evicted
        await use(replica, target(2))  # loads again, and a2's return evicts a3 (least recently used)
        assert fake.added_loras.count(102) == 2 and fake.resident_loras == {101, 102, 104}
        adapters.max_cpu_bytes = None
        await use(replica, target(5))
        assert fake.resident_loras == {101, 102, 104, 105}
    finally:
        await replica.__del__()


async def test_a_dedicated_replica_serves_its_version_merged_and_refuses_every_other_call(tmp_path, monkeypatch):
    import dataclasses

    import loraplex.engine.deployment as deployment
    from loraplex.dedicated.targets import DedicatedTarget

    target = DedicatedTarget(ADAPTER.lora_int_id, ADAPTER.tenant, ADAPTER.name, ADAPTER.version, ADAPTER.sha256, "config")
    built = []

    def merged_engine_config(config, t, store):  # the real one builds the checkpoint with peft
        built.append(t)
        return config.model_copy(update={"engine": config.engine.model_copy(update={
            "model": str(tmp_path / "merged"), "enable_lora": False})})

    monkeypatch.setattr(deployment, "merged_engine_config", merged_engine_config)
    engine_cls = type("VLLMEngineOverFakeVLLM", (VLLMEngineOverFakeVLLM,), {"fake_store": FakeAdapterStore(tmp_path)})
    replica = Engine.__new__(Engine)
    await replica.__init__(make_config(tmp_path), engine_cls=engine_cls, dedicated=target)
    try:
        assert built == [target]
        assert (replica.engine.config.model, replica.engine.config.enable_lora) == (str(tmp_path / "merged"), False)
        llm(replica).script = Script(tokens=4)
        merged_call = dataclasses.replace(make_call(adapter=ADAPTER), path="merged")
        text = b"".join(c.data for c in await drain(replica.generate(merged_call, chat(model="bot@2")))).decode()
        assert '"model":"bot@2"' in text and f'"model":"{BASE_MODEL}"' not in text  # the client's name
        _, _, lora = llm(replica).generate_calls[-1]
        assert lora is None  # no LoRA: the version is in the weights
        [row] = ledger_rows(replica)
        assert (row["adapter"], row["path"], row["completion_tokens"]) == ("bot@2", "merged", 4)
        other = AdapterTarget("ten_a/bot@3:def", 8, "ten_a", "bot", "def", requested_as="bot@3", version=3)
        for call in [make_call(adapter=ADAPTER), make_call(), dataclasses.replace(make_call(adapter=other), path="merged")]:
            [refusal] = await drain(replica.generate(call, chat()))
            assert isinstance(refusal, EngineError) and (refusal.status, refusal.reason) == (503, "wrong_path")
        assert len(ledger_rows(replica)) == 1  # refusals are never billed
    finally:
        await replica.__del__()


async def test_a_lora_replica_refuses_a_call_sent_down_the_merged_path(replica):
    import dataclasses

    [refusal] = await drain(replica.generate(dataclasses.replace(make_call(adapter=ADAPTER), path="merged"), chat()))
    assert isinstance(refusal, EngineError) and refusal.reason == "wrong_path"
    assert llm(replica).generate_calls == [] and ledger_rows(replica) == []


async def stalled_stream(replica, request_id: str) -> asyncio.Task:
    """A stream of `request_id` running on `replica`, stalled after 3 tokens, driven by a task as
    Serve's task drives the replica's generator; returned once vLLM runs it."""
    fake = llm(replica)
    fake.script = Script(prompt_len=5, cached=0, tokens=50, stall_after=3)
    gen = replica.generate(make_call(request_id), chat())

    async def consume():
        return [item async for item in gen]

    task = asyncio.create_task(consume())
    await wait_for(lambda: replica.in_flight.total == 1 and fake.get_num_unfinished_requests() == 1, "the call running")
    return task


async def test_a_stream_running_when_the_replica_stops_is_handed_back_unmetered(tmp_path):
    """Serve stopping the replica (scale-down, redeploy) after its graceful period: a call still
    running ends with ReplicaStopping for its ingress to move (ingress/migration.py), its vLLM
    request aborted, and no record here: the replica that finishes it meters it whole."""
    from loraplex.contract import ReplicaStopping

    replica = await start_replica(tmp_path)
    fake = llm(replica)
    task = await stalled_stream(replica, "req-moving")
    await replica.__del__()
    with pytest.raises(ReplicaStopping):
        await task
    assert fake.aborted == [["cmpl-req-moving-0"]]
    with replica.ledger.engine.connect() as conn:
        assert conn.execute(select(usage_records)).all() == []


async def test_a_stream_outlasting_the_graceful_period_is_handed_back_before_it_ends(tmp_path):
    """Serve drains a stopping replica for its whole graceful period and calls __del__ only after,
    at the controller's kill deadline: a call that outlasts the period would die with the replica.
    The replica hands it back itself, engine/hand_back.py's margin before the period ends (here
    half of 2 s), with no __del__; a call that arrives after that does not start here."""
    from loraplex.contract import ReplicaStopping

    serve_stops = [False]
    replica = await start_replica(tmp_path, stopping=lambda: serve_stops[0], graceful_shutdown_timeout_s=2.0)
    fake = llm(replica)
    task = await stalled_stream(replica, "req-moving")
    serve_stops[0] = True
    await asyncio.sleep(0.2)
    assert not task.done()  # the graceful period's first half: it may still end here on its own
    with pytest.raises(ReplicaStopping):
        await asyncio.wait_for(task, DEADLINE_S)
    assert fake.aborted == [["cmpl-req-moving-0"]]
    with pytest.raises(ReplicaStopping):
        await drain(replica.generate(make_call("req-late"), chat()))
    assert len(fake.generate_calls) == 1
    with replica.ledger.engine.connect() as conn:
        assert conn.execute(select(usage_records)).all() == []
    await replica.__del__()
