"""`BenchmarkFakeEngine`: a fake of the engine the Engine deployment drives (loraplex.contract),
emitting tokens itself at a GPU's pace or at once, loading no model and no vLLM. For benchmarks
of the code around the engine (ingress, router, Engine deployment, metering) at rates this CPU's
real engine cannot make; never a stand-in for the engine in a test of the engine."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, AsyncIterator


class _StepClock:
    """One decode step for every stream of a replica, like a GPU batch: a shared tick every
    `interval`. A late tick catches up (streams then emit every token that was due), so the
    offered load stays streams / interval whatever the event loop's lag."""

    def __init__(self, interval: float):
        self.interval = interval
        self.t0 = 0.0
        self.tick = 0
        self._next: asyncio.Future | None = None
        self._task: asyncio.Task | None = None

    def now(self) -> int:
        """The current step; the clock starts with the first stream."""
        if self._task is None:
            self.t0 = time.monotonic()
            self._task = asyncio.get_running_loop().create_task(self._run())
        return self.tick

    async def wait(self) -> None:
        self.now()
        if self._next is None:
            self._next = asyncio.get_running_loop().create_future()
        await asyncio.shield(self._next)

    async def _run(self) -> None:
        while True:
            due = self.t0 + (self.tick + 1) * self.interval
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            # Timers may fire a hair early: a tick always moves on.
            self.tick = max(self.tick + 1, int((time.monotonic() - self.t0) / self.interval))
            waiting, self._next = self._next, None
            if waiting is not None:
                waiting.set_result(None)


class _NoAdapters:
    """The fake serves the base model only: it holds no adapter (contract.EngineAdapters)."""

    def __init__(self):
        self.targets: dict = {}

    def loaded_ids(self) -> list[int]:
        return []

    async def retire(self, lora_int_ids: set[int]) -> None:
        pass

    def note_resident(self, lora_int_ids: set[int], sampled_at: float = float("inf")) -> int:
        return 0


class BenchmarkFakeEngine:
    """A fake of contract.EngineBackend (the engine the Engine deployment drives), emitting tokens
    itself (no model, no vLLM); tests/unit/test_contract.py checks it against the Protocol.
    `config.engine_kwargs["benchmark_token_interval_s"]`: seconds per token (0: instant)."""

    def __init__(self, config, replica_id: str = "", adapter_store=None, metrics=None):
        self.model = config.model_id
        self.replica_id = replica_id
        interval = float(config.engine_kwargs.get("benchmark_token_interval_s", 0.02))
        self.clock = _StepClock(interval) if interval > 0 else None
        self.adapters = _NoAdapters()
        self.probes_done = 0
        self._last = time.time()
        self._running = 0

    async def start(self) -> None:
        pass

    async def shutdown(self) -> None:
        pass

    async def generate(self, call, request, usage) -> AsyncIterator[Any]:
        n = getattr(request, "max_completion_tokens", None) or request.max_tokens or 16
        usage.prompt_tokens = 8
        usage.engine_request_ids.append(request.request_id)
        self._running += 1
        try:
            if not request.stream:
                async for _ in self._tokens(n, usage):
                    pass
                yield {"id": f"chatcmpl-{request.request_id}", "object": "chat.completion",
                       "created": int(time.time()), "model": request.model,
                       "choices": [{"index": 0, "message": {"role": "assistant", "content": " tok" * n},
                                    "finish_reason": "length"}],
                       "usage": {"prompt_tokens": usage.prompt_tokens, "completion_tokens": n,
                                 "total_tokens": usage.prompt_tokens + n}}
                return
            # vLLM's chunk shape, serialized once per request: per token only the tail differs.
            head = ('data: {"id":"chatcmpl-%s","object":"chat.completion.chunk","created":%d,"model":%s,'
                    '"choices":[{"index":0,"delta":{"content":" tok"},"logprobs":null,"finish_reason":'
                    % (request.request_id, int(time.time()), json.dumps(request.model)))
            middle, last = head + "null}]}\n\n", head + '"length"}]}\n\n'
            async for i in self._tokens(n, usage):
                yield last if i == n - 1 else middle
            yield "data: [DONE]\n\n"
        finally:
            self._running -= 1
            if usage.finish_time is None:  # cancelled: the client went away
                usage.status, usage.finish_time = "client_disconnect", time.time()

    async def _tokens(self, n: int, usage) -> AsyncIterator[int]:
        """Token indexes 0..n-1 at the engine's pace, metering each as the contract says."""
        start = self.clock.now() if self.clock else 0
        i = 0
        while i < n:
            due = n if self.clock is None else min(n, self.clock.tick - start + 1)
            while i < due:
                usage.completion_tokens += 1
                if i == 0:
                    usage.first_token()
                yield i
                i += 1
                if self.clock is None:
                    await asyncio.sleep(0)  # one token per stream per loop turn: a batch, not a hog
            self._last = time.time()
            if i < n and self.clock is not None:
                await self.clock.wait()
        usage.finish_reason = usage.status = "length"
        usage.finish_time = time.time()

    async def probe(self, timeout_s: float = 60.0) -> float:
        self.probes_done += 1
        self._last = time.time()
        return 0.0

    def last_progress(self) -> float:
        return self._last

    def num_unfinished_requests(self) -> int:
        return self._running

    async def resident_adapter_ids(self) -> set[int]:
        return set()

    async def base_models(self) -> dict:
        return {"object": "list", "data": [{"id": self.model, "object": "model", "owned_by": "loraplex",
                                            "root": self.model, "parent": None}]}
