"""LoadedAdapters bounds cache_dir (issue 34): past registry.cache_max_bytes, after a fetch, the
least recently used copies vLLM no longer holds and no request runs with leave the disk; never a
version in use; a pruned one is fetched again on its next use."""

import asyncio
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from adapter_cache_builders import FakeLLM, FakeServingModels, cached, three_versions  # noqa: E402

from loraplex.engine.loaded_adapters import LoadedAdapters  # noqa: E402
from loraplex.registry.store import AdapterStore  # noqa: E402


@pytest.fixture
def setup(tmp_path):
    config, targets, one = three_versions(tmp_path)
    # Room for two copies, not three.
    store = AdapterStore(config.model_copy(update={"cache_max_bytes": 2 * one + one // 2}))
    return LoadedAdapters(FakeLLM(), FakeServingModels(), store), targets, tmp_path / "cache" / "acme"


def test_the_lru_copy_vllm_evicted_is_pruned_past_the_budget_never_one_in_use(setup):
    loaded, (a, b, c), cache_dir = setup

    async def main():
        for t in (a, b):
            await loaded.acquire(t)
            await loaded.release(t)
        # vLLM evicted both from its CPU tier; `b` has a request running.
        loaded.evicted |= {a.lora_name, b.lora_name}
        await loaded.acquire(b)  # loads b again (evicted), and keeps it running
        loaded.evicted.add(b.lora_name)
        await loaded.acquire(c)  # third copy: over the budget
        assert cached(cache_dir) == sorted([b.sha256, c.sha256])  # a (idle, evicted, LRU) went; b runs
        await loaded.release(c)
        await loaded.acquire(a)  # pruned: fetched again on its next use
        assert a.sha256 in cached(cache_dir)
        assert b.sha256 in cached(cache_dir)  # still running: never removed

    asyncio.run(main())


def test_a_version_vllm_holds_is_never_pruned(setup):
    loaded, (a, b, c), cache_dir = setup

    async def main():
        for t in (a, b, c):
            await loaded.acquire(t)
            await loaded.release(t)
        # None evicted by vLLM: all held, so all stay, over the budget.
        assert cached(cache_dir) == sorted([a.sha256, b.sha256, c.sha256])

    asyncio.run(main())
