"""FakeEngineClient: stands in for ServeEngineClient in ingress unit tests (no Ray, no vLLM); an
EngineClient (loraplex.contract), checked against it in tests/unit/test_contract.py.

A script yields what the Engine replica's engine would: SSE strings, a response dict, or an
EngineError; the fake turns strings and dicts into the EngineChunks the replica sends (one
completion token per SSE string), so the ingress sees the real wire format.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Callable, Iterable

from loraplex.contract import EngineChunk


class FakeEngineClient:
    def __init__(self, script: Callable[..., Iterable[Any]], calls: dict[str, Any] | None = None,
                 prompt_tokens: int = 3):
        self.script = script
        self.calls = calls or {}
        self.prompt_tokens = prompt_tokens
        self.requests: list[tuple] = []  # (method, *args): for generate, (method, call, request)
        self.finished = 0
        self.closed_early = 0

    def generate(self, call, request):
        return self._stream("generate", call, request)

    async def base_models(self) -> dict[str, Any]:
        return await self._call("base_models")

    async def ready(self) -> dict[str, Any]:
        return await self._call("ready")

    async def replica_status(self) -> dict[str, Any]:
        return await self._call("replica_status")

    async def _stream(self, method: str, *args: Any):
        self.requests.append((method, *args))
        done = False
        tokens = 0
        try:
            for item in self.script(method, *args):
                await asyncio.sleep(0)
                if isinstance(item, str):
                    tokens += item != "data: [DONE]\n\n"
                    item = EngineChunk(item.encode(), self.prompt_tokens, 0, tokens)
                elif isinstance(item, dict):
                    item = EngineChunk(json.dumps(item).encode(), self.prompt_tokens, 0, tokens)
                yield item
            done = True
        finally:
            if done:
                self.finished += 1
            else:
                self.closed_early += 1

    async def _call(self, method: str) -> Any:
        value = self.calls[method]
        if isinstance(value, BaseException):
            raise value
        return value() if callable(value) else value
