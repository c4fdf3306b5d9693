"""How the ingress talks to Engine replicas: a DeploymentHandle behind the contract's EngineClient.

The ingress's routes call only `generate`, `base_models`, `ready` and `replica_status` (loraplex.contract's
EngineClient), so unit tests hand it a fake engine client instead of a Ray handle. Each method
names the Engine deployment's method it calls: no method names as strings.
"""

from __future__ import annotations

from typing import Any, AsyncIterator

from loraplex.contract import EngineCall, EngineChunk, EngineError


class ServeEngineClient:
    def __init__(self, handle):
        self.handle = handle
        self._streaming = handle.options(stream=True)  # options() builds a new handle: once, not per request

    async def generate(self, call: EngineCall, request: Any) -> AsyncIterator[EngineChunk | EngineError]:
        """Engine.generate(call, request) on the replica the router picks (from `call`, the first
        argument: contract.call_of), streamed."""
        response = self._streaming.generate.remote(call, request)
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

    async def base_models(self) -> dict[str, Any]:
        return await self.handle.base_models.remote()

    async def replica_status(self) -> dict[str, Any]:
        """One replica's queue and routing state (Engine.replica_status), for GET /admin/replicas."""
        return await self.handle.replica_status.remote()

    async def ready(self) -> dict[str, Any]:
        """A real 1-token generation on one replica (Engine.ready), for /readyz."""
        return await self.handle.ready.remote()
