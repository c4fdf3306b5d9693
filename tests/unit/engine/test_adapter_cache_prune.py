"""LoadedAdapters bounds cache_dir (issue 34): past registry.cache_max_bytes, after a fetch, the
least recently used copies vLLM no longer holds and no request runs with leave the disk; never a
version in use; a pruned one is fetched again on its next use."""

import asyncio
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "registry"))
from registry_builders import SMOLLM2_CONFIG, lora_config, lora_tensors, tar_dir, write_adapter  # noqa: E402

from loraplex.registry.config import RegistryConfig  # noqa: E402
from loraplex.contract import AdapterTarget  # noqa: E402
from loraplex.db.engine import make_engine  # noqa: E402
from loraplex.engine.loaded_adapters import LoadedAdapters  # noqa: E402
from loraplex.registry.catalog import AdapterCatalog  # noqa: E402
from loraplex.registry.model_spec import BaseModelSpec  # noqa: E402
from loraplex.registry.bases import ServedBases
from loraplex.registry.registry import AdapterRegistry  # noqa: E402
from loraplex.registry.store import AdapterStore  # noqa: E402
from loraplex.registry.validator import AdapterValidator  # noqa: E402


class FakeLLM:
    async def add_lora(self, request):
        return True

    async def remove_lora(self, lora_int_id):
        return True

    async def collective_rpc(self, *args, **kwargs):
        return None


class FakeServingModels:
    def __init__(self):
        self.lora_requests = {}


@pytest.fixture
def setup(tmp_path):
    spec = BaseModelSpec.from_config(SMOLLM2_CONFIG, "SmolLM2-135M-Instruct")
    probe = RegistryConfig(store_url=str(tmp_path / "store"), cache_dir=str(tmp_path / "cache"))
    registry = AdapterRegistry(probe, ServedBases.one(AdapterValidator(spec, max_lora_rank=16)), AdapterStore(probe),
                               AdapterCatalog(make_engine(f"sqlite:///{tmp_path}/db")))
    targets = []
    for i in range(3):
        src = write_adapter(tmp_path / f"a{i}", lora_config(r=4), lora_tensors(spec, r=4, fill=0.01 * (i + 1)))
        v = registry.upload("acme", f"a{i}", tar_dir(src, tmp_path / f"a{i}.tgz"))
        targets.append(AdapterTarget(v.lora_name, v.id, "acme", v.name, v.sha256, v.name, v.version))
    one = v.size_bytes
    # Room for two copies, not three.
    store = AdapterStore(probe.model_copy(update={"cache_max_bytes": 2 * one + one // 2}))
    return LoadedAdapters(FakeLLM(), FakeServingModels(), store), targets, tmp_path / "cache" / "acme"


def cached(cache_dir):
    return sorted(p.name for p in cache_dir.iterdir()) if cache_dir.exists() else []


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
