"""Where the tests find the default model (prepared by scripts/setup)."""

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODEL_NAME = "SmolLM2-135M-Instruct"


def default_model_dir() -> Path:
    path = Path(os.environ.get("LORAPLEX_MODEL", ROOT / "models" / MODEL_NAME))
    if not (path / "config.json").exists():
        raise RuntimeError(f"no model at {path}: run scripts/setup (it prepares the default model)")
    return path
