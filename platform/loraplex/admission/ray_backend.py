"""RayBackend: the shared limiter state in named Ray actors, one per shard of tenants.

The first ingress replica to call creates a shard's actor (`get_if_exists`, detached, num_cpus=0,
named after the Serve app, in the replica's namespace); every replica then calls the same one,
after sending it its settings (the database, budget_cache_s, on_unavailable: LimiterActor.configure).
An actor that died is looked up again (or recreated empty) at once and the call retried; only
when that fails too does the admission fail open (or closed, by config). Calls that time out
grant nothing (they carry a deadline the actor checks).
"""

from __future__ import annotations

import asyncio
import logging
import time
import zlib

from loraplex.admission.limiter import BackendUnavailable

logger = logging.getLogger(__name__)

ACTOR_PREFIX = "loraplex-limiter"
NAMESPACE = "serve"  # Serve's own namespace: a fixed place every replica (and an operator) finds it


def actor_name(app_name: str, shard: int) -> str:
    return f"{ACTOR_PREFIX}:{app_name}:{shard}"


class RayBackend:
    def __init__(self, app_name: str, database_url: str | None, shards: int = 1, budget_cache_s: float = 5.0,
                 timeout_s: float = 1.0, startup_timeout_s: float = 30.0, namespace: str = NAMESPACE,
                 on_unavailable: str = "open"):
        self.app_name, self.database_url, self.shards = app_name, database_url, shards
        self.on_unavailable = on_unavailable  # the actor's policy when its budget source fails
        self.budget_cache_s, self.timeout_s, self.startup_timeout_s = budget_cache_s, timeout_s, startup_timeout_s
        self.namespace = namespace
        self.handles: list = [None] * shards
        self.answered = [False] * shards  # a shard's first call may wait for the actor to start

    def shard(self, tenant: str) -> int:
        return zlib.crc32(tenant.encode()) % self.shards

    def handle(self, shard: int):
        if self.handles[shard] is None:
            import ray

            from loraplex.admission.actor import LimiterActor

            handle = ray.remote(LimiterActor).options(
                name=actor_name(self.app_name, shard), namespace=self.namespace, get_if_exists=True,
                lifetime="detached", num_cpus=0, max_concurrency=1000,
            ).remote(self.database_url, self.budget_cache_s, on_unavailable=self.on_unavailable)
            # An actor that already existed kept its constructor's settings: send ours (a deploy
            # may have changed them); calls from one caller run in order, so before our acquires.
            handle.configure.remote(self.database_url, self.budget_cache_s, self.on_unavailable)
            self.handles[shard] = handle
        return self.handles[shard]

    async def acquire(self, tenant, holder, limits, need, want):
        shard = self.shard(tenant)
        for attempt in (1, 2):
            timeout = self.timeout_s if self.answered[shard] else self.startup_timeout_s
            try:
                handle = self.handle(shard)
                result = await asyncio.wait_for(
                    handle.acquire.remote(tenant, holder, limits, need, want, time.time() + timeout), timeout)
            except asyncio.TimeoutError:
                raise BackendUnavailable(f"no answer in {timeout} s")
            except Exception as exc:  # RayActorError & co: the actor is gone
                # Another replica may already have recreated it under the same name: look it up
                # (or create it) once more before failing open, else every ingress replica that
                # still holds the dead handle admits one request unchecked.
                self.handles[shard], self.answered[shard] = None, False
                if attempt == 2:
                    raise BackendUnavailable(repr(exc)) from exc
                continue
            self.answered[shard] = True
            return result

    async def give_back(self, tenant, holder, epoch, returned, consumed):
        await self._quiet(tenant, "give_back", tenant, holder, epoch, returned, consumed)

    async def touch(self, tenant, holder):
        await self._quiet(tenant, "touch", holder)

    async def _quiet(self, tenant, method, *args):
        shard = self.shard(tenant)
        handle = self.handles[shard]
        if handle is None:
            return
        try:
            await asyncio.wait_for(getattr(handle, method).remote(*args), self.startup_timeout_s)
        except Exception as exc:
            logger.debug("limiter %s failed: %r", method, exc)


def limiter_stats(app_name: str, shard: int = 0, namespace: str = NAMESPACE) -> dict:
    """The shard's grants per tenant and replica (tests, operators): ray.get on the driver."""
    import ray

    return ray.get(ray.get_actor(actor_name(app_name, shard), namespace=namespace).stats.remote())
