"""scripts/train_adapter.py writes an archive the registry accepts for the real base model."""

from __future__ import annotations

import subprocess
import sys

from registry_builders import REPO

from loraplex.registry.config import RegistryConfig
from loraplex.db.engine import make_engine
from loraplex.registry.catalog import AdapterCatalog
from loraplex.registry.model_spec import BaseModelSpec
from loraplex.registry.bases import ServedBases
from loraplex.registry.registry import AdapterRegistry
from loraplex.registry.store import AdapterStore
from loraplex.registry.validator import AdapterValidator


def test_trained_archive_is_accepted(real_model_dir, tmp_path):
    out = tmp_path / "banana.tar.gz"
    # One step of batch one: this checks the file format, not what the adapter learned.
    subprocess.run([sys.executable, str(REPO / "scripts" / "train_adapter.py"),
                    "--base", str(real_model_dir), "--data", str(REPO / "adapters/recipes/banana.jsonl"),
                    "--out", str(out), "--steps", "1", "--batch-size", "1", "--rank", "4"],
                   check=True, capture_output=True, timeout=600)
    validator = AdapterValidator(BaseModelSpec.from_pretrained_dir(real_model_dir), max_lora_rank=8)
    cfg = RegistryConfig(store_url=str(tmp_path / "store"), cache_dir=str(tmp_path / "cache"))
    registry = AdapterRegistry(cfg, ServedBases.one(validator), AdapterStore(cfg), AdapterCatalog(make_engine(f"sqlite:///{tmp_path}/db")))
    version = registry.upload("acme", "banana", out)
    assert (version.rank, version.target_modules) == (4, ["q_proj", "v_proj"])
