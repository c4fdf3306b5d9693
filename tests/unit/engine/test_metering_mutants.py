"""The metering path's pure parts, pinned value by value: `record_output` (what vLLM's outputs
count for), the `UsageTrackingAsyncLLM` wrapper around AsyncLLM.generate, and `usage_record`.

Written to kill the mutants `mutmut` left alive in engine/usage_tracking.py and engine/metering.py
(docs/testing.md): each assertion is one a plausible slip (a reset instead of a sum, a count taken
twice, a field mapped to its neighbour) would break. Fakes stand in only for vLLM's output
objects and AsyncLLM's own generate.
"""
import sys
import threading
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

import pytest
from vllm.sampling_params import RequestOutputKind
from vllm.v1.engine.async_llm import AsyncLLM

from loraplex.engine import usage_tracking
from loraplex.engine.metering import usage_record
from loraplex.contract import AdapterTarget, EngineCall, RequestUsage
from loraplex.engine.usage_tracking import UsageTrackingAsyncLLM, current_usage, record_output

CUMULATIVE, DELTA = RequestOutputKind.CUMULATIVE, RequestOutputKind.DELTA


@dataclass
class Choice:  # vLLM's CompletionOutput, as record_output reads it
    index: int
    token_ids: list
    finish_reason: str | None = None


@dataclass
class Output:  # vLLM's RequestOutput, as record_output reads it
    request_id: str
    outputs: list = field(default_factory=list)
    prompt_token_ids: list | None = None
    num_cached_tokens: int | None = None


def out(request_id="e0", tokens=(), prompt=10, cached=None, index=0, finish=None, choices=None):
    return Output(request_id, choices or [Choice(index, list(tokens), finish)],
                  list(range(prompt)) if prompt is not None else None, cached)


@pytest.fixture
def clock(monkeypatch):
    """usage_tracking's time.time(), stepping by one second per call from 1000."""
    now = [999.0]
    real = usage_tracking.time.time

    def tick():
        # Only this test's own calls step it: a thread left by an earlier test in the same process
        # (CI runs the integration tests first) calling time.time() gets the real time.
        if (threading.current_thread() is not threading.main_thread()
                or not sys._getframe(1).f_globals.get("__name__", "").startswith("loraplex.")):
            return real()  # (and a log record's timestamp, or any other library's, stays real too)
        now[0] += 1
        return now[0]
    monkeypatch.setattr(usage_tracking.time, "time", tick)
    return now


def counts(u: RequestUsage) -> tuple:
    return u.prompt_tokens, u.cached_prompt_tokens, u.completion_tokens


def test_cumulative_outputs_count_the_latest_total_not_the_sum():
    u = RequestUsage()
    for n in (1, 3, 6):
        record_output(u, out(tokens=range(n), cached=4), CUMULATIVE)
    assert counts(u) == (10, 4, 6)  # the prompt once, not per output


def test_delta_outputs_add_up():
    u = RequestUsage()
    for n in (1, 2, 3):
        record_output(u, out(tokens=range(n)), DELTA)
    assert counts(u) == (10, 0, 6)


def test_each_choice_counts_once_by_its_index():
    u = RequestUsage()
    record_output(u, out(choices=[Choice(0, [1, 2]), Choice(1, [1])]), CUMULATIVE)
    record_output(u, out(choices=[Choice(0, [1, 2, 3]), Choice(1, [1, 2])]), CUMULATIVE)
    assert u.completion_tokens == 5
    record_output(u, out(choices=[Choice(1, [7])]), DELTA)  # only choice 1 moves
    assert u.completion_tokens == 6


def test_engine_requests_of_a_batched_completion_are_summed():
    u = RequestUsage()
    record_output(u, out("e0", tokens=[1, 2], prompt=10, cached=8), CUMULATIVE)
    record_output(u, out("e1", tokens=[1], prompt=7, cached=None), CUMULATIVE)
    assert counts(u) == (17, 8, 3)
    record_output(u, out("e1", tokens=[1, 2, 3], prompt=7, cached=2), CUMULATIVE)
    assert counts(u) == (17, 10, 5)
    assert set(u._completion_by_output) == {"e0", "e1"}


def test_the_last_cached_count_is_the_engines_final_word():
    u = RequestUsage()
    record_output(u, out(cached=8), CUMULATIVE)
    record_output(u, out(cached=None), CUMULATIVE)  # not known in this output: kept
    assert u.cached_prompt_tokens == 8
    record_output(u, out(cached=0), CUMULATIVE)  # 0 is a real count, not "unknown"
    assert u.cached_prompt_tokens == 0


def test_an_output_without_prompt_ids_counts_no_prompt():
    u = RequestUsage()
    record_output(u, out(prompt=None, tokens=[1]), CUMULATIVE)
    assert counts(u) == (0, 0, 1)


def test_first_token_time_is_the_first_output_with_tokens(clock):
    u = RequestUsage()
    record_output(u, out(tokens=[]), CUMULATIVE)  # prefill done, no token yet
    assert u.first_token_time is None
    record_output(u, out(tokens=[1]), CUMULATIVE)
    first = u.first_token_time
    assert first == 1000.0
    record_output(u, out(tokens=[1, 2]), CUMULATIVE)
    assert u.first_token_time == first


def test_finish_reason_is_taken_when_a_choice_reports_one():
    u = RequestUsage()
    record_output(u, out(tokens=[1]), CUMULATIVE)
    assert u.finish_reason is None
    record_output(u, out(choices=[Choice(0, [1, 2], "length"), Choice(1, [1])]), CUMULATIVE)
    assert u.finish_reason == "length"
    record_output(u, out(choices=[Choice(1, [1, 2])]), CUMULATIVE)  # None does not erase it
    assert u.finish_reason == "length"


# --------------------------------------------------------------------------------------------
# UsageTrackingAsyncLLM.generate: binds the current RequestUsage and counts what it yields
# --------------------------------------------------------------------------------------------
class Params:
    def __init__(self, kind=None):
        if kind is not None:
            self.output_kind = kind


def fake_llm(monkeypatch, outputs):
    """A UsageTrackingAsyncLLM whose AsyncLLM.generate yields `outputs` (no engine is built)."""
    closed = []

    async def inner():
        try:
            for o in outputs:
                yield o
        finally:
            closed.append(True)

    calls = []

    def generate(self, prompt, sampling_params, request_id, **kwargs):
        calls.append((prompt, request_id, kwargs))
        return inner()
    monkeypatch.setattr(AsyncLLM, "generate", generate)
    return object.__new__(UsageTrackingAsyncLLM), calls, closed


async def collect(gen, n=None):
    got = []
    async for o in gen:
        got.append(o)
        if n is not None and len(got) == n:
            await gen.aclose()
            break
    return got


async def test_generate_counts_into_the_usage_current_when_called(monkeypatch, clock):
    outputs = [out("e0", tokens=[1]), out("e0", tokens=[1, 2], finish="stop")]
    llm, calls, closed = fake_llm(monkeypatch, outputs)
    u = RequestUsage()
    token = current_usage.set(u)
    try:
        gen = llm.generate("p", Params(), "e0", lora_request=None)
    finally:
        current_usage.reset(token)  # bound at the call, not at the first iteration
    assert calls == [("p", "e0", {"lora_request": None})] and u.engine_request_ids == ["e0"]
    assert await collect(gen) == outputs  # passed through unchanged
    assert counts(u) == (10, 0, 2) and u.finish_reason == "stop"  # CUMULATIVE by default
    assert closed == [True] and llm.last_output_at == 1002.0  # the last output's time (1001: TTFT)


async def test_generate_reads_the_output_kind_of_the_sampling_params(monkeypatch):
    llm, _, _ = fake_llm(monkeypatch, [out(tokens=[1, 2]), out(tokens=[3])])
    u = RequestUsage()
    token = current_usage.set(u)
    try:
        gen = llm.generate("p", Params(DELTA), "e0")
    finally:
        current_usage.reset(token)
    await collect(gen)
    assert u.completion_tokens == 3


async def test_generate_without_a_current_usage_is_not_wrapped(monkeypatch):
    llm, _, _ = fake_llm(monkeypatch, [out(tokens=[1])])
    gen = llm.generate("p", Params(), "e0")
    assert gen.__qualname__ == "fake_llm.<locals>.inner"  # AsyncLLM's own generator
    assert len(await collect(gen)) == 1


async def test_closing_the_counted_stream_closes_vllms_at_once(monkeypatch):
    llm, _, closed = fake_llm(monkeypatch, [out(tokens=[1]), out(tokens=[1, 2]), out(tokens=[1, 2, 3])])
    u = RequestUsage()
    token = current_usage.set(u)
    try:
        gen = llm.generate("p", Params(), "e0")
    finally:
        current_usage.reset(token)
    await collect(gen, n=1)  # the client went away after one output
    assert closed == [True] and u.completion_tokens == 1


# --------------------------------------------------------------------------------------------
# usage_record: the ledger's record from the call and the engine's counts
# --------------------------------------------------------------------------------------------
T = datetime(2026, 11, 30, 12, tzinfo=timezone.utc).timestamp()
ADAPTER = AdapterTarget("ten/bot@abc", 7, "ten", "bot", "abc", "bot", version=2)


def test_usage_record_maps_every_field():
    call = EngineCall(request_id="req-1", tenant_id="ten", api_key_id="key", adapter=ADAPTER, arrival_time=T,
                      path="merged", batch=True)
    usage = RequestUsage(prompt_tokens=9, cached_prompt_tokens=4, completion_tokens=3, replica_id="rep",
                         first_token_time=T + 0.5, finish_time=T + 2, status="length")
    rec = usage_record(call, usage, "base-model")
    utc = lambda s: datetime.fromtimestamp(s, timezone.utc)  # noqa: E731
    assert rec.row() == {
        "request_id": "req-1", "tenant_id": "ten", "api_key_id": "key", "base_model": "base-model",
        "adapter": "bot@2", "prompt_tokens": 9, "cached_prompt_tokens": 4, "completion_tokens": 3,
        "status": "length", "arrival_time": utc(T), "first_token_time": utc(T + 0.5),
        "finish_time": utc(T + 2), "ttft": 0.5, "replica_id": "rep", "path": "merged", "batch": True,
        "migrated_prompt_tokens": 0}


def test_usage_record_defaults_for_what_is_unknown():
    call = EngineCall(request_id="req-2", tenant_id="ten")  # no arrival time, no key, base model
    usage = RequestUsage(finish_time=T)  # never got a status or a replica id
    rec = usage_record(call, usage, "base")
    assert (rec.status, rec.replica_id, rec.adapter, rec.api_key_id, rec.path) == ("error", None, None, None, None)
    assert rec.batch is False
    assert rec.arrival_time == rec.finish_time == datetime.fromtimestamp(T, timezone.utc)
    assert rec.first_token_time is None and rec.ttft is None
    assert rec.finish_time - rec.arrival_time == timedelta(0)

