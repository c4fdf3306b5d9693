"""The ingress's EngineClient with several base models: each call goes to the Engine pool of its
base (`EngineCall.base_model`; None: the first base), and the pools' answers to /v1/models,
/readyz and /admin/replicas are joined. One pool: the ingress uses that pool's client as it is."""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator

from loraplex.contract import EngineCall, EngineChunk, EngineClient, EngineError


class PooledEngineClient:
    def __init__(self, pools: dict[str, EngineClient]):
        if not pools:
            raise ValueError("PooledEngineClient needs at least one pool")
        self.pools = pools  # base name -> its pool's client, the first base (the default) first
        self.default = next(iter(pools))

    def pool(self, base_model: str | None) -> EngineClient:
        return self.pools[base_model or self.default]

    def generate(self, call: EngineCall, request: Any) -> AsyncIterator[EngineChunk | EngineError]:
        return self.pool(call.base_model).generate(call, request)

    async def base_models(self) -> dict[str, Any]:
        """Every pool's base model, in the config's order (each pool lists its own)."""
        answers = await asyncio.gather(*(client.base_models() for client in self.pools.values()))
        return {"object": "list", "data": [model for answer in answers for model in answer["data"]]}

    async def ready(self) -> dict[str, Any]:
        """A real 1-token generation on one replica of every pool: the first failure raises, so
        /readyz is ready only while every base can serve."""
        answers = await asyncio.gather(*(client.ready() for client in self.pools.values()))
        return {"pools": dict(zip(self.pools, answers))}

    async def replica_status(self) -> dict[str, Any]:
        """One replica of the first pool, asked now (the others' come from their routing stats)."""
        return await self.pools[self.default].replica_status()
