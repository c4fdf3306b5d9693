"""bench/hostile/edges.py: its attacks follow the hostile-client interface, its zip bomb is what
the attack says (tiny, declaring 256 MiB) and is refused by the ratio cap, its synthetic adapters
are valid LoRAs of the default model (so quota_exhaustion hits the quota, not the validator)."""

import asyncio
import inspect
import sys
from pathlib import Path

import pytest

pytest.importorskip("bench.hostile.attack")  # the interface (branch i34a until merged)
from bench.hostile import edges  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "registry"))
from registry_builders import SMOLLM2_CONFIG  # noqa: E402

from loraplex.registry.config import RegistryConfig  # noqa: E402
from loraplex.registry.archive import UploadTooLarge, extract_archive  # noqa: E402
from loraplex.registry.model_spec import BaseModelSpec  # noqa: E402
from loraplex.registry.validator import AdapterValidator  # noqa: E402


def test_every_attack_is_an_async_function_of_the_context():
    assert {a.__name__ for a in edges.ATTACKS} == {"zip_bomb", "readyz_hammer", "quota_exhaustion", "random_key_flood"}
    for attack in edges.ATTACKS:
        assert asyncio.iscoroutinefunction(attack) and list(inspect.signature(attack).parameters)[0] == "ctx"


def test_the_bomb_is_tiny_and_refused_by_the_ratio_cap(tmp_path):
    bomb = edges.bz2_zip_bomb(64 << 20)
    assert len(bomb) < 64 << 10
    (tmp_path / "bomb.zip").write_bytes(bomb)
    with pytest.raises(UploadTooLarge, match="registry.max_compression_ratio"):
        extract_archive(tmp_path / "bomb.zip", tmp_path / "out", RegistryConfig())


def test_synthetic_adapters_are_valid_and_distinct(tmp_path):
    validator = AdapterValidator(BaseModelSpec.from_config(SMOLLM2_CONFIG, "SmolLM2-135M-Instruct"), max_lora_rank=16)
    for seed in (0, 1):
        (tmp_path / f"{seed}.tgz").write_bytes(edges.synthetic_adapter(seed))
        validator.validate(extract_archive(tmp_path / f"{seed}.tgz", tmp_path / f"out{seed}", RegistryConfig()))
    assert edges.synthetic_adapter(0) != edges.synthetic_adapter(1)
