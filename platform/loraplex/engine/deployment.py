"""Engine: the Ray Serve deployment that hosts one VLLMEngine per replica."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, AsyncIterator

from ray import serve

from loraplex.config import EngineDeploymentConfig, PlatformConfig
from loraplex.engine.vllm_engine import EngineItem, VLLMEngine

logger = logging.getLogger(__name__)


class Engine:
    """Serve replica around VLLMEngine. `engine_cls` is injectable so tests can swap the engine."""

    async def __init__(self, config: PlatformConfig, engine_cls: type = VLLMEngine):
        from loraplex.db import make_engine
        from loraplex.registry import AdapterStore
        from loraplex.registry.catalog import AdapterCatalog

        try:
            replica_id = serve.get_replica_context().replica_id.unique_id
        except Exception:  # outside Serve (unit tests)
            replica_id = "local"
        self.replica_id = replica_id
        self.ready_probe_max_age_s = config.engine_deployment.ready_probe_max_age_s
        registry = config.registry
        store = AdapterStore(registry.store_url, registry.storage_options, registry.cache_dir)
        self.catalog = AdapterCatalog(make_engine(config.database_url))
        self.engine = engine_cls(config.engine, replica_id=replica_id, adapter_store=store)
        await self.engine.start()
        self._free_deleted = asyncio.create_task(self._free_deleted_adapters(registry.deletion_poll_s))

    async def chat(self, request, adapter=None, cache_salt=None) -> AsyncIterator[EngineItem]:
        async for item in self.engine.chat(request, adapter, cache_salt):
            yield item

    async def completions(self, request, adapter=None, cache_salt=None) -> AsyncIterator[EngineItem]:
        async for item in self.engine.completions(request, adapter, cache_salt):
            yield item

    async def list_models(self) -> dict[str, Any]:
        return await self.engine.list_models()

    async def ready(self) -> dict[str, Any]:
        """A real 1-token generation on this replica, for /readyz."""
        seconds = await self.engine.probe()
        return {"replica_id": self.replica_id, "probe_seconds": round(seconds, 4)}

    def num_unfinished_requests(self) -> int:
        return self.engine.num_unfinished_requests()

    def loaded_adapters(self) -> list[str]:
        return sorted(self.engine.adapters.targets)

    async def check_health(self) -> None:
        # Serve calls this every health_check_period_s; a replica that cannot produce a token
        # is replaced. Skip the probe when real traffic or a recent probe already proved it.
        if time.time() - self.engine.last_probe_ok > self.ready_probe_max_age_s / 2:
            await self.engine.probe()

    async def _free_deleted_adapters(self, period_s: float) -> None:
        # DELETE marks the catalog row; every replica notices here and frees its copy once the
        # requests still running with it finish. Polling keeps replicas free of any broadcast.
        while True:
            await asyncio.sleep(period_s)
            try:
                loaded = self.engine.adapters.loaded_ids()
                deleted = await asyncio.to_thread(self.catalog.deleted_among, loaded)
                if deleted:
                    await self.engine.adapters.retire(deleted)
            except Exception:
                logger.exception("could not check for deleted adapters; retrying")

    async def __del__(self):
        self._free_deleted.cancel()
        await self.engine.shutdown()


def engine_deployment(deployment: EngineDeploymentConfig):
    """Apply serve.deployment with the config's resources; the class stays plain for tests."""
    return serve.deployment(
        Engine,
        name="Engine",
        num_replicas=deployment.num_replicas,
        max_ongoing_requests=deployment.max_ongoing_requests,
        health_check_period_s=deployment.health_check_period_s,
        health_check_timeout_s=deployment.health_check_timeout_s,
        ray_actor_options={"num_cpus": deployment.num_cpus, "num_gpus": deployment.num_gpus},
    )
