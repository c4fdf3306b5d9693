"""Trains the demo adapters (adapters/recipes) once per recipe version and caches the archives.

Used by the tests (tests/integration/demo_adapters.py re-exports it) and by python -m bench loadtest,
which uploads them as tenants' adapters."""

import hashlib
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / "var" / "test-adapters"


def trained_adapter(recipe: str) -> Path:
    """A .tar.gz LoRA trained on adapters/recipes/<recipe>.jsonl (about a minute on one core)."""
    data = ROOT / "adapters" / "recipes" / f"{recipe}.jsonl"
    script = ROOT / "scripts" / "train_adapter.py"
    digest = hashlib.sha256(data.read_bytes() + script.read_bytes()).hexdigest()[:16]
    out = CACHE / f"{recipe}-{digest}.tar.gz"
    if not out.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        partial = out.with_suffix(".partial.tar.gz")
        subprocess.run(
            [sys.executable, str(script), "--data", str(data), "--out", str(partial)],
            check=True, capture_output=True, text=True,
        )
        partial.rename(out)
    return out
