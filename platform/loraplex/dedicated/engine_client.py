"""The ingress's EngineClient when some adapter versions have dedicated replicas: each call goes
down the path DedicatedPaths chooses, and back to the LoRA pool when the merged replica cannot take
it (lost, unreachable, its queue full) before its first chunk. Nothing changes for the client: the
same stream bytes, model name and usage record (with `path` saying which served it)."""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any, AsyncIterator

from loraplex.contract import EngineCall, EngineChunk, EngineClient, EngineError, EngineLost
from loraplex.dedicated.path_choice import DedicatedPaths

logger = logging.getLogger(__name__)


class PathChoosingEngineClient:
    def __init__(self, lora: EngineClient, merged: dict[int, EngineClient], paths: DedicatedPaths, clock=time.monotonic):
        self.lora = lora  # the shared Engine pool: every version, by LoRA
        self.merged = merged  # adapter id -> its dedicated deployment's client
        self.paths = paths
        self.clock = clock

    async def generate(self, call: EngineCall, request: Any) -> AsyncIterator[EngineChunk | EngineError]:
        if self.paths.choose(call, self.clock()) == "merged":
            adapter_id = call.adapter.lora_int_id
            merged_call = dataclasses.replace(call, path="merged")
            stream = self.merged[adapter_id].generate(merged_call, request)
            try:
                first = await anext(stream)
            except StopAsyncIteration:
                first = None
            except Exception as exc:  # lost or unreachable before any token: nothing was generated
                logger.warning("dedicated replica of adapter %s failed (%r); LoRA path for %g s",
                               adapter_id, exc, self.paths.failure_backoff_s)
                self.paths.failed(adapter_id, self.clock())
                first = None
            if first is not None and not (isinstance(first, EngineError) and first.reason == "wrong_path"):
                yield first
                try:
                    async for item in stream:
                        yield item
                except Exception as exc:  # lost mid-stream: billed by the ingress, as merged
                    raise EngineLost(merged_call, exc) from exc
                return
            await stream.aclose()
        async for item in self.lora.generate(call, request):
            yield item

    async def base_models(self) -> dict[str, Any]:
        return await self.lora.base_models()

    async def ready(self) -> dict[str, Any]:
        return await self.lora.ready()

    async def replica_status(self) -> dict[str, Any]:
        return await self.lora.replica_status()
