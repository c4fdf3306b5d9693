"""Adapters for the benchmarks and tests: the demo adapters (adapters/recipes), trained once per
recipe version and cached, and synthetic ones (random weights, any number of distinct ones).

Used by the tests (tests/integration/demo_adapters.py re-exports it), by python -m bench loadtest,
which uploads them as tenants' adapters, by python -m bench adapters and the hostile client's edges."""

import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import threading
from pathlib import Path
from typing import Iterable, Optional

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / "var" / "test-adapters"
RECIPES = ROOT / "adapters" / "recipes"
SCRIPT = ROOT / "scripts" / "train_adapter.py"

_background: Optional[threading.Thread] = None  # training the recipes train_in_background was given


def cached_archive(recipe: str) -> Path:
    """Where the recipe's archive is cached: named for the recipe's and the script's contents."""
    data = RECIPES / f"{recipe}.jsonl"
    digest = hashlib.sha256(data.read_bytes() + SCRIPT.read_bytes()).hexdigest()[:16]
    return CACHE / f"{recipe}-{digest}.tar.gz"


def _train(recipe: str, threads: Optional[int] = None) -> None:
    out = cached_archive(recipe)
    CACHE.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(f"{out.name}.{os.getpid()}.partial")  # another process may train it too
    argv = [sys.executable, str(SCRIPT), "--data", str(RECIPES / f"{recipe}.jsonl"), "--out", str(partial)]
    subprocess.run(argv + (["--threads", str(threads)] if threads else []), check=True, capture_output=True, text=True)
    partial.rename(out)


def recipes() -> list[str]:
    """The demo adapters' recipes: adapters/recipes/<name>.jsonl."""
    return sorted(p.stem for p in RECIPES.glob("*.jsonl"))


def train_in_background(names: Iterable[str], threads: int = 1) -> None:
    """Train the recipes not cached yet, one after the other on `threads` threads, while the
    caller goes on (the test suite: its unit tests leave a core idle); trained_adapter waits."""
    global _background
    todo = [r for r in names if not cached_archive(r).exists()]
    if not todo or _background is not None:
        return

    def run():
        for recipe in todo:
            try:
                _train(recipe, threads)
            except subprocess.CalledProcessError:
                pass  # trained_adapter trains it again in the foreground and raises with the output

    _background = threading.Thread(target=run, name="demo-adapters", daemon=True)
    _background.start()


def trained_adapter(recipe: str) -> Path:
    """A .tar.gz LoRA trained on adapters/recipes/<recipe>.jsonl (about a minute on one core)."""
    out = cached_archive(recipe)
    if not out.exists() and _background is not None:
        _background.join()
    if not out.exists():
        _train(recipe)
    return out


def synthetic_adapter(seed: int, rank: int = 4, layers: int = 30, hidden: int = 576, kv_out: int = 192) -> bytes:
    """A distinct, valid rank-`rank` LoRA on q_proj/v_proj of SmolLM2-135M, as a .tar.gz (random fp16 weights)."""
    import numpy as np
    from safetensors.numpy import save

    rng = np.random.default_rng(seed)
    tensors = {}
    for i in range(layers):
        for module, out_f in (("q_proj", hidden), ("v_proj", kv_out)):
            prefix = f"base_model.model.model.layers.{i}.self_attn.{module}"
            tensors[f"{prefix}.lora_A.weight"] = rng.normal(0, 0.01, (rank, hidden)).astype(np.float16)
            tensors[f"{prefix}.lora_B.weight"] = rng.normal(0, 0.01, (out_f, rank)).astype(np.float16)
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": 2 * rank,
              "target_modules": ["q_proj", "v_proj"], "lora_dropout": 0.0, "bias": "none"}
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz", compresslevel=1) as tar:
        for name, data in (("adapter_config.json", json.dumps(config).encode()),
                           ("adapter_model.safetensors", save(tensors))):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


if __name__ == "__main__":
    # scripts/test: the demo adapters not cached yet, trained on one thread while the unit tests run.
    for name in recipes():
        if not cached_archive(name).exists():
            try:
                _train(name, threads=1)
            except subprocess.CalledProcessError:
                pass  # trained_adapter trains it again in the foreground and raises with the output
