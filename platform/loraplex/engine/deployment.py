"""Engine: the Ray Serve deployment that hosts one VLLMEngine per replica."""

from __future__ import annotations

import time
from typing import Any, AsyncIterator

from ray import serve

from loraplex.config import EngineConfig, EngineDeploymentConfig
from loraplex.engine.vllm_engine import EngineItem, VLLMEngine


class Engine:
    """Serve replica around VLLMEngine. `engine_cls` is injectable so tests can swap the engine."""

    async def __init__(
        self,
        config: EngineConfig,
        ready_probe_max_age_s: float = 30.0,
        engine_cls: type = VLLMEngine,
    ):
        try:
            replica_id = serve.get_replica_context().replica_id.unique_id
        except Exception:  # outside Serve (unit tests)
            replica_id = "local"
        self.replica_id = replica_id
        self.ready_probe_max_age_s = ready_probe_max_age_s
        self.engine = engine_cls(config, replica_id=replica_id)
        await self.engine.start()

    async def chat(self, request) -> AsyncIterator[EngineItem]:
        async for item in self.engine.chat(request):
            yield item

    async def completions(self, request) -> AsyncIterator[EngineItem]:
        async for item in self.engine.completions(request):
            yield item

    async def list_models(self) -> dict[str, Any]:
        return await self.engine.list_models()

    async def ready(self) -> dict[str, Any]:
        """A real 1-token generation on this replica, for /readyz."""
        seconds = await self.engine.probe()
        return {"replica_id": self.replica_id, "probe_seconds": round(seconds, 4)}

    def num_unfinished_requests(self) -> int:
        return self.engine.num_unfinished_requests()

    async def check_health(self) -> None:
        # Serve calls this every health_check_period_s; a replica that cannot produce a token
        # is replaced. Skip the probe when real traffic or a recent probe already proved it.
        if time.time() - self.engine.last_probe_ok > self.ready_probe_max_age_s / 2:
            await self.engine.probe()

    async def __del__(self):
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
