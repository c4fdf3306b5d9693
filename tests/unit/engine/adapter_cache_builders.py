"""What the adapter cache's tests build: a registry with three uploaded versions of one tenant's
adapter, and fakes of vLLM's engine and serving models for LoadedAdapters (named as fakes)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "registry"))
from registry_builders import SMOLLM2_CONFIG, lora_config, lora_tensors, tar_dir, write_adapter  # noqa: E402

from loraplex.contract import AdapterTarget  # noqa: E402
from loraplex.db.engine import make_engine  # noqa: E402
from loraplex.registry.bases import ServedBases  # noqa: E402
from loraplex.registry.catalog import AdapterCatalog  # noqa: E402
from loraplex.registry.config import RegistryConfig  # noqa: E402
from loraplex.registry.model_spec import BaseModelSpec  # noqa: E402
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


def three_versions(tmp_path: Path) -> tuple[RegistryConfig, list[AdapterTarget], int]:
    """Three versions of tenant acme's adapters in a store under tmp_path: the registry config
    (cache_dir tmp_path/cache), their targets, and one version's size in bytes."""
    spec = BaseModelSpec.from_config(SMOLLM2_CONFIG, "SmolLM2-135M-Instruct")
    config = RegistryConfig(store_url=str(tmp_path / "store"), cache_dir=str(tmp_path / "cache"))
    registry = AdapterRegistry(config, ServedBases.one(AdapterValidator(spec, max_lora_rank=16)), AdapterStore(config),
                               AdapterCatalog(make_engine(f"sqlite:///{tmp_path}/db")))
    targets = []
    for i in range(3):
        src = write_adapter(tmp_path / f"a{i}", lora_config(r=4), lora_tensors(spec, r=4, fill=0.01 * (i + 1)))
        v = registry.upload("acme", f"a{i}", tar_dir(src, tmp_path / f"a{i}.tgz"))
        targets.append(AdapterTarget(v.lora_name, v.id, "acme", v.name, v.sha256, v.name, v.version))
    return config, targets, v.size_bytes


def cached(cache_dir: Path) -> list[str]:
    """The versions (sha256) with a copy in cache_dir."""
    return sorted(p.name for p in cache_dir.iterdir()) if cache_dir.exists() else []
