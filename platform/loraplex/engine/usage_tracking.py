"""Count the tokens vLLM really processes for each client request.

vLLM's OpenAI layer turns one client request into one or more `AsyncLLM.generate` calls (one per
prompt of a batched completion). We subclass AsyncLLM so every RequestOutput is seen where it is
produced; a context variable, set by the Engine replica around its OpenAI call, says which client
request the outputs belong to. Counting here rather than from the SSE stream keeps the numbers
right when the client disconnects mid-stream or the usage chunk is never sent.
"""

from __future__ import annotations

import contextvars
import time
from typing import AsyncGenerator

from vllm.outputs import RequestOutput
from vllm.sampling_params import RequestOutputKind
from vllm.v1.engine.async_llm import AsyncLLM

from loraplex.contract import RequestUsage

current_usage: contextvars.ContextVar[RequestUsage | None] = contextvars.ContextVar(
    "loraplex_current_usage", default=None
)


def record_output(usage: RequestUsage, output: RequestOutput, kind: RequestOutputKind) -> None:
    key = output.request_id
    if key not in usage._completion_by_output:
        usage._completion_by_output[key] = {}
        usage.prompt_tokens += len(output.prompt_token_ids or ())
    per_choice = usage._completion_by_output[key]
    if usage.scheduled_time is None:
        scheduled_at(usage, output)
    if output.num_cached_tokens is not None:
        # Known once prefill is scheduled; the last report is the engine's final word.
        per_choice["cached"] = output.num_cached_tokens
    for choice in output.outputs:
        n = len(choice.token_ids)
        if n and usage.first_token_time is None:
            usage.first_token()
        if kind == RequestOutputKind.DELTA:
            per_choice[choice.index] = per_choice.get(choice.index, 0) + n
        else:
            per_choice[choice.index] = n
        if choice.finish_reason is not None:
            usage.finish_reason = choice.finish_reason
    usage.completion_tokens = sum(
        v for d in usage._completion_by_output.values() for k, v in d.items() if k != "cached"
    )
    usage.cached_prompt_tokens = sum(
        d.get("cached", 0) for d in usage._completion_by_output.values()
    )


def scheduled_at(usage: RequestUsage, output: RequestOutput) -> None:
    """When vLLM first scheduled the request, from its request stats (log_stats, vLLM's default):
    its engine-core timestamps are time.monotonic() of the same host, taken to wall time here."""
    stats = getattr(output, "metrics", None)
    scheduled = getattr(stats, "scheduled_ts", 0.0) if stats is not None else 0.0
    if scheduled:
        usage.scheduled_time = time.time() - (time.monotonic() - scheduled)


class UsageTrackingAsyncLLM(AsyncLLM):
    """AsyncLLM that also adds every output's token counts to the current RequestUsage."""

    # time.time() of the last output of any request: the engine is alive and making progress.
    last_output_at: float = 0.0

    def generate(self, prompt, sampling_params, request_id, **kwargs) -> AsyncGenerator:
        # A plain def on purpose: vLLM's serving layer calls generate() while our Engine
        # replica's context is current, and we bind the RequestUsage right then rather than at
        # first iteration, which may run in another task's context.
        usage = current_usage.get()
        outputs = super().generate(prompt, sampling_params, request_id, **kwargs)
        if usage is None:
            return outputs
        usage.engine_request_ids.append(request_id)
        kind = getattr(sampling_params, "output_kind", RequestOutputKind.CUMULATIVE)
        return self._counted(outputs, usage, kind)

    async def _counted(self, outputs, usage: RequestUsage, kind: RequestOutputKind) -> AsyncGenerator:
        try:
            async for output in outputs:
                self.last_output_at = time.time()
                record_output(usage, output, kind)
                yield output
        finally:
            # Closing the inner generator now (not at GC) makes AsyncLLM abort the request at once.
            await outputs.aclose()
