"""record_output and UsageTrackingAsyncLLM: the tokens a tenant is billed for, counted from vLLM's
own RequestOutputs (real `vllm.outputs` objects here)."""

from __future__ import annotations

import asyncio
import itertools

import pytest
from vllm.outputs import CompletionOutput, RequestOutput
from vllm.sampling_params import RequestOutputKind, SamplingParams
from vllm.v1.engine.async_llm import AsyncLLM

from loraplex.engine import usage_tracking
from loraplex.contract import RequestUsage
from loraplex.engine.usage_tracking import UsageTrackingAsyncLLM, current_usage, record_output

DELTA, CUMULATIVE, FINAL_ONLY = RequestOutputKind.DELTA, RequestOutputKind.CUMULATIVE, RequestOutputKind.FINAL_ONLY


def choice(index: int, token_ids: list[int], finish_reason: str | None = None) -> CompletionOutput:
    return CompletionOutput(index=index, text="x" * len(token_ids), token_ids=token_ids, cumulative_logprob=None,
                            logprobs=None, finish_reason=finish_reason)


def output(request_id: str, choices: list[CompletionOutput], prompt_len: int = 5,
           cached: int | None = None) -> RequestOutput:
    return RequestOutput(request_id=request_id, prompt=None, prompt_token_ids=list(range(prompt_len)),
                         prompt_logprobs=None, outputs=choices,
                         finished=all(c.finish_reason is not None for c in choices), num_cached_tokens=cached)


@pytest.fixture
def clock(monkeypatch):
    """time.time() as usage_tracking sees it: 1000.0, 1001.0, 1002.0, ..."""
    ticks = itertools.count(1000.0)
    monkeypatch.setattr(usage_tracking.time, "time", lambda: next(ticks))


def test_delta_outputs_add_up():
    usage = RequestUsage()
    record_output(usage, output("r", [choice(0, [11])], prompt_len=7), DELTA)
    record_output(usage, output("r", [choice(0, [12, 13])], prompt_len=7), DELTA)
    record_output(usage, output("r", [choice(0, [14], "stop")], prompt_len=7), DELTA)
    assert (usage.prompt_tokens, usage.completion_tokens) == (7, 4)  # the prompt counted once
    assert usage.finish_reason == "stop"


@pytest.mark.parametrize("kind", [CUMULATIVE, FINAL_ONLY])
def test_cumulative_outputs_count_the_last_report(kind):
    usage = RequestUsage()
    record_output(usage, output("r", [choice(0, [11])]), kind)
    record_output(usage, output("r", [choice(0, [11, 12])]), kind)
    record_output(usage, output("r", [choice(0, [11, 12, 13], "length")]), kind)
    assert (usage.prompt_tokens, usage.completion_tokens) == (5, 3)  # not 1 + 2 + 3
    assert usage.finish_reason == "length"


def test_several_choices_delta():
    # n=2: each output carries both choices' new tokens; the prompt is processed (and billed) once.
    usage = RequestUsage()
    record_output(usage, output("r", [choice(0, [1]), choice(1, [2])]), DELTA)
    record_output(usage, output("r", [choice(0, [3]), choice(1, [4, 5])]), DELTA)
    record_output(usage, output("r", [choice(1, [6], "stop")]), DELTA)  # only choice 1 moved
    record_output(usage, output("r", [choice(0, [7], "length")]), DELTA)
    assert (usage.prompt_tokens, usage.completion_tokens) == (5, 3 + 4)  # choice 0: 3, choice 1: 4
    assert usage.finish_reason == "length"  # the last choice to finish


def test_several_choices_cumulative():
    usage = RequestUsage()
    record_output(usage, output("r", [choice(0, [1]), choice(1, [2])]), CUMULATIVE)
    record_output(usage, output("r", [choice(0, [1, 3]), choice(1, [2, 4, 5])]), CUMULATIVE)
    record_output(usage, output("r", [choice(1, [2, 4, 5, 6], "stop")]), CUMULATIVE)  # choice 0 keeps 2
    assert usage.completion_tokens == 2 + 4


def test_several_engine_requests_of_one_batched_completion_add_up():
    usage = RequestUsage()
    record_output(usage, output("cmpl-0", [choice(0, [1])], prompt_len=4, cached=0), DELTA)
    record_output(usage, output("cmpl-1", [choice(0, [2])], prompt_len=6, cached=3), DELTA)
    record_output(usage, output("cmpl-0", [choice(0, [3], "stop")], prompt_len=4, cached=0), DELTA)
    record_output(usage, output("cmpl-1", [choice(0, [4, 5], "stop")], prompt_len=6, cached=3), DELTA)
    assert (usage.prompt_tokens, usage.cached_prompt_tokens, usage.completion_tokens) == (10, 3, 5)


def test_several_engine_requests_cumulative():
    usage = RequestUsage()
    record_output(usage, output("a", [choice(0, [1, 2])]), CUMULATIVE)
    record_output(usage, output("b", [choice(0, [1])]), CUMULATIVE)
    record_output(usage, output("a", [choice(0, [1, 2, 3])]), CUMULATIVE)
    assert (usage.prompt_tokens, usage.completion_tokens) == (10, 4)


def test_cached_tokens_take_the_last_report_per_engine_request():
    usage = RequestUsage()
    record_output(usage, output("r", [choice(0, [])], cached=None), DELTA)  # not scheduled yet
    assert usage.cached_prompt_tokens == 0
    record_output(usage, output("r", [choice(0, [1])], cached=2), DELTA)
    record_output(usage, output("r", [choice(0, [2])], cached=4), DELTA)
    assert usage.cached_prompt_tokens == 4  # the engine's last word, not 2 + 4
    record_output(usage, output("r", [choice(0, [3])], cached=None), DELTA)  # no report: keep it
    assert usage.cached_prompt_tokens == 4
    record_output(usage, output("other", [choice(0, [1])], cached=1), DELTA)
    assert usage.cached_prompt_tokens == 5 and usage.completion_tokens == 4


def test_first_token_time_is_set_by_the_first_token_only(clock):
    usage = RequestUsage()
    record_output(usage, output("r", [choice(0, [])]), DELTA)  # an output with no token yet
    assert usage.first_token_time is None
    record_output(usage, output("r", [choice(0, [1])]), DELTA)
    first = usage.first_token_time
    assert first is not None
    record_output(usage, output("r", [choice(0, [2])]), DELTA)
    record_output(usage, output("r2", [choice(0, [1])]), DELTA)  # another engine request's first token
    assert usage.first_token_time == first


def test_finish_reason_is_none_until_a_choice_finishes():
    usage = RequestUsage()
    record_output(usage, output("r", [choice(0, [1])]), DELTA)
    assert usage.finish_reason is None
    record_output(usage, output("r", [choice(0, [], "abort")]), DELTA)
    assert usage.finish_reason == "abort" and usage.completion_tokens == 1


# --------------------------------------------------------------------------------------------
# UsageTrackingAsyncLLM over a fake engine core
# --------------------------------------------------------------------------------------------
class FakeAsyncLLM(AsyncLLM):
    """vLLM's engine core, faked: `generate` yields the outputs given to it (no engine process;
    AsyncLLM.__init__ is never called)."""

    def __init__(self, outputs_by_request: dict[str, list[RequestOutput]]):  # noqa: D107
        self.outputs_by_request = outputs_by_request
        self.gate = asyncio.Event()
        self.gate.set()
        self.closed: list[str] = []

    async def generate(self, prompt, sampling_params, request_id, **kwargs):
        try:
            for out in self.outputs_by_request[request_id]:
                await self.gate.wait()
                yield out
        finally:
            self.closed.append(request_id)

    def shutdown(self, timeout=None) -> None:
        pass


class FakeAsyncLLMWithUsageTracking(UsageTrackingAsyncLLM, FakeAsyncLLM):
    """The real UsageTrackingAsyncLLM over the fake core."""


def delta_params() -> SamplingParams:
    return SamplingParams(max_tokens=8, output_kind=DELTA)


async def test_generate_counts_into_the_usage_current_when_it_is_called():
    llm = FakeAsyncLLMWithUsageTracking({"e1": [output("e1", [choice(0, [1])], cached=2),
                                                output("e1", [choice(0, [2], "stop")], cached=2)]})
    usage = RequestUsage()
    token = current_usage.set(usage)
    outputs = llm.generate({"prompt": "hi"}, delta_params(), "e1")
    current_usage.reset(token)
    assert usage.engine_request_ids == ["e1"]

    async def consume_elsewhere():  # e.g. vLLM's stream generator run by another task
        assert current_usage.get() is None
        return [o async for o in outputs]

    got = await asyncio.create_task(consume_elsewhere())
    assert len(got) == 2
    assert (usage.prompt_tokens, usage.cached_prompt_tokens, usage.completion_tokens) == (5, 2, 2)
    assert usage.finish_reason == "stop" and llm.last_output_at > 0


async def test_generate_takes_the_cumulative_kind_from_the_sampling_params():
    llm = FakeAsyncLLMWithUsageTracking({"e1": [output("e1", [choice(0, [1])]),
                                                output("e1", [choice(0, [1, 2, 3], "stop")])]})
    usage = RequestUsage()
    current_usage.set(usage)
    try:
        [o async for o in llm.generate({"prompt": "hi"}, SamplingParams(output_kind=CUMULATIVE), "e1")]
    finally:
        current_usage.set(None)
    assert usage.completion_tokens == 3


async def test_generate_without_a_current_usage_is_not_counted():
    # The readiness probe and anything else outside a client request: outputs pass through.
    outs = [output("probe", [choice(0, [1], "length")])]
    llm = FakeAsyncLLMWithUsageTracking({"probe": outs})
    assert current_usage.get() is None
    assert [o async for o in llm.generate({"prompt_token_ids": [1]}, delta_params(), "probe")] == outs


async def test_closing_the_counted_stream_closes_vllms_at_once():
    # AsyncLLM aborts a request when its generator is closed: that must happen now, not at GC.
    llm = FakeAsyncLLMWithUsageTracking({"e1": [output("e1", [choice(0, [1])]), output("e1", [choice(0, [2])])]})
    usage = RequestUsage()
    current_usage.set(usage)
    try:
        outputs = llm.generate({"prompt": "hi"}, delta_params(), "e1")
    finally:
        current_usage.set(None)
    await outputs.__anext__()
    llm.gate.clear()  # the next token is not there yet
    await outputs.aclose()
    assert llm.closed == ["e1"]
    assert usage.completion_tokens == 1
