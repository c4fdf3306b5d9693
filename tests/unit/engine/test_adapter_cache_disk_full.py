"""The adapter cache's disk full (a real tmpfs under registry.cache_dir): a fetch the disk refuses
removes this replica's idle copies, least recently used first, and is retried once; with nothing
idle it fails with 503 adapter_cache_full naming the cache, leaving no partial copy, and is not
counted as an adapter store failure."""

import asyncio
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from adapter_cache_builders import FakeLLM, FakeServingModels, cached, three_versions  # noqa: E402

from loraplex.disk_full import CacheDiskFull  # noqa: E402
from loraplex.engine.loaded_adapters import LoadedAdapters  # noqa: E402
from loraplex.registry.store import AdapterStore  # noqa: E402
from small_disk import small_disk  # noqa: E402


@pytest.fixture
def full_cache(tmp_path):
    """Three versions in the store; a cache disk with room for two copies, not three."""
    config, targets, one = three_versions(tmp_path)
    pages = -(-(2 * one + one // 2) // 4096)
    with small_disk(tmp_path / "cache", f"{pages * 4096}") as disk:
        store = AdapterStore(config.model_copy(update={"cache_dir": str(disk), "cache_max_bytes": None}))
        failures = []
        store.io.on_failure = failures.append  # an adapter store failure would land here
        yield LoadedAdapters(FakeLLM(), FakeServingModels(), store), targets, disk, failures


def test_a_full_cache_prunes_the_lru_idle_copy_and_retries(full_cache):
    loaded, (a, b, c), disk, failures = full_cache

    async def main():
        for t in (a, b):
            await loaded.acquire(t)
            await loaded.release(t)
        loaded.evicted |= {a.lora_name, b.lora_name}  # vLLM let both go: idle copies
        await loaded.acquire(c)  # no room for a third: a (least recently used) goes, c is fetched
        assert cached(disk / "acme") == sorted([b.sha256, c.sha256])
        assert failures == []

    asyncio.run(main())


def test_a_full_cache_with_nothing_idle_is_a_503_naming_it_and_leaves_no_partial_copy(full_cache):
    loaded, (a, b, c), disk, failures = full_cache

    async def main():
        for t in (a, b):
            await loaded.acquire(t)  # both running: neither may go
        with pytest.raises(CacheDiskFull) as refused:
            await loaded.acquire(c)
        assert refused.value.status == 503 and refused.value.code == "adapter_cache_full"
        assert str(disk) in refused.value.message and refused.value.headers["Retry-After"]
        assert cached(disk / "acme") == sorted([a.sha256, b.sha256])  # no `.sha.*` temp copy left
        assert failures == []  # the store answered: not its failure
        await loaded.release(a)
        loaded.evicted.add(a.lora_name)
        await loaded.acquire(c)  # once a copy is idle, the next request for c is served
        assert c.sha256 in cached(disk / "acme")

    asyncio.run(main())
