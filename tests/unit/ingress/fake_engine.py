"""FakeEngineClient: stands in for ServeEngineClient in ingress unit tests (no Ray, no vLLM)."""

from __future__ import annotations

import asyncio
from typing import Any, Callable, Iterable


class FakeEngineClient:
    def __init__(self, script: Callable[[str, Any], Iterable[Any]], calls: dict[str, Any] | None = None):
        self.script = script
        self.calls = calls or {}
        self.requests: list[tuple[str, Any]] = []
        self.finished = 0
        self.closed_early = 0

    async def stream(self, method: str, request: Any, *context: Any):
        self.requests.append((method, request, *context))
        done = False
        try:
            for item in self.script(method, request, *context):
                await asyncio.sleep(0)
                yield item
            done = True
        finally:
            if done:
                self.finished += 1
            else:
                self.closed_early += 1

    async def call(self, method: str, *args: Any) -> Any:
        value = self.calls[method]
        if isinstance(value, BaseException):
            raise value
        return value() if callable(value) else value
