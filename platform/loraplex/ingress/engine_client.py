"""How the ingress talks to Engine replicas: a DeploymentHandle behind the contract's EngineClient.

The ingress's routes call only `generate`, `base_models`, `ready` and `replica_status` (loraplex.contract's
EngineClient), so unit tests hand it a fake engine client instead of a Ray handle. Each method
names the Engine deployment's method it calls: no method names as strings.
"""

from __future__ import annotations

import dataclasses
from typing import Any, AsyncIterator

from loraplex.contract import EngineCall, EngineChunk, EngineError


class ServeEngineClient:
    def __init__(self, handle):
        self.handle = handle
        self._streaming = handle.options(stream=True)  # options() builds a new handle: once, not per request
        # This Ingress replica's actor name: an Engine replica aborts our calls if it dies.
        self.caller = _actor_name()

    async def generate(self, call: EngineCall, request: Any) -> AsyncIterator[EngineChunk | EngineError]:
        """Engine.generate(call, request) on the replica the router picks (from `call`, the first
        argument: contract.call_of), streamed."""
        if self.caller is not None and call.caller is None:
            call = dataclasses.replace(call, caller=self.caller)
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


def _actor_name() -> str | None:
    """The Ray actor name of this process's actor (a Serve replica's), None outside one."""
    try:
        import ray

        if not ray.is_initialized():
            return None
        return ray.get_runtime_context().get_actor_name() or None
    except Exception:
        return None
