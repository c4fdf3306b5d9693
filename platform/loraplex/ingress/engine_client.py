"""How the ingress talks to Engine replicas: a DeploymentHandle behind two small calls.

The ingress's routes only use `stream()` and `call()`, so unit tests can hand it a fake engine
client instead of a Ray handle.
"""

from __future__ import annotations

from typing import Any, AsyncIterator


class ServeEngineClient:
    def __init__(self, handle):
        self.handle = handle

    async def stream(self, method: str, *args: Any) -> AsyncIterator[Any]:
        response = getattr(self.handle.options(stream=True), method).remote(*args)
        finished = False
        try:
            async for item in response:
                yield item
            finished = True
        finally:
            if not finished:
                # A client that went away must stop the engine at once: cancelling the handle
                # call cancels the replica's generator, and vLLM aborts the request.
                response.cancel()

    async def call(self, method: str, *args: Any) -> Any:
        return await getattr(self.handle, method).remote(*args)
