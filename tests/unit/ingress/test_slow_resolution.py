"""A slow database and adapter resolution (TenantContext): a model resolved here before waits at
most resolve_wait_s for the catalog, then runs with its last resolution while the query lands in
the background; requests arriving meanwhile join that one query; a delete the late answer
brings is applied; a model never resolved here waits for the database. The registry is a fake
whose `resolve` takes `latency_s` (a thread sleep, as a slow query would block)."""

import asyncio
import threading
import time
from types import SimpleNamespace

import pytest

from loraplex.ingress.tenant_context import TenantContext
from loraplex.registry.store import AdapterNotFound

ACME = SimpleNamespace(tenant_id="ten_acme", plan="default")


class SlowFakeRegistry:
    def __init__(self):
        self.latency_s = 0.0
        self.version = 1
        self.deleted = False
        self.queries = 0
        self._lock = threading.Lock()

    def resolve(self, tenant, ref):
        with self._lock:
            self.queries += 1
        time.sleep(self.latency_s)
        if self.deleted:
            raise AdapterNotFound(f"The model `{ref}` does not exist.")
        return SimpleNamespace(lora_name=f"{tenant}/{ref}", id=self.version, tenant=tenant, name=ref,
                               sha256="0" * 64, version=self.version, base_model="base")


def context(registry, resolve_wait_s=0.05):
    return TenantContext(None, registry, base_model="base", resolve_wait_s=resolve_wait_s)


async def resolve(ctx):
    started = time.monotonic()
    _, target = await ctx.resolve_model(ACME, "style")
    return target.version, time.monotonic() - started


def test_a_slow_catalog_costs_a_resolved_model_at_most_resolve_wait_s():
    async def run():
        registry = SlowFakeRegistry()
        ctx = context(registry)
        assert (await resolve(ctx))[0] == 1  # the first resolution waits for the database
        registry.latency_s, registry.version = 0.5, 2
        version, took = await resolve(ctx)
        assert version == 1 and took < 0.3  # the last answer, not the database's 0.5 s
        assert ctx.served_while_slow == 1
        await asyncio.sleep(0.6)  # the query lands in the background
        registry.latency_s = 0.0
        assert (await resolve(ctx))[0] == 2  # prompt again: the catalog as it is

    asyncio.run(run())


def test_requests_while_a_query_is_in_flight_join_it():
    async def run():
        registry = SlowFakeRegistry()
        ctx = context(registry)
        await resolve(ctx)
        registry.latency_s = 0.5
        results = await asyncio.gather(*(resolve(ctx) for _ in range(20)))
        assert all(took < 0.3 for _, took in results)
        assert registry.queries == 2  # the first, then one for the 20 (not 20)
        await asyncio.sleep(0.6)

    asyncio.run(run())


def test_a_delete_the_late_answer_brings_is_applied():
    async def run():
        registry = SlowFakeRegistry()
        ctx = context(registry)
        await resolve(ctx)
        registry.latency_s, registry.deleted = 0.3, True
        assert (await resolve(ctx))[0] == 1  # the query has not answered yet
        await asyncio.sleep(0.4)
        with pytest.raises(AdapterNotFound):  # forgotten: the next request waits for the database
            await resolve(ctx)

    asyncio.run(run())


def test_a_model_never_resolved_here_waits_for_the_database():
    async def run():
        registry = SlowFakeRegistry()
        registry.latency_s = 0.3
        version, took = await resolve(context(registry))
        assert version == 1 and took >= 0.3

    asyncio.run(run())


def test_resolve_wait_s_is_the_bound():
    async def run():
        registry = SlowFakeRegistry()
        ctx = context(registry, resolve_wait_s=0.4)
        await resolve(ctx)
        registry.latency_s = 0.2
        version, took = await resolve(ctx)
        assert took >= 0.2 and ctx.served_while_slow == 0  # answered within the bound: its answer

    asyncio.run(run())
