"""The canonical form of a validated adapter and its content address (sha256).

We hash the canonical files, not the uploaded archive: re-packing the same adapter (another tar
tool, gzip timestamp, file order, zip instead of tar, a top-level folder or not) must give the
same sha, so uploads are idempotent and a vLLM LoRA name `tenant/name@sha` always means the
same weights. Canonical = adapter_config.json re-serialized with sorted keys, plus the
safetensors bytes as uploaded; README and other extras are dropped.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from loraplex.registry.validator import CONFIG_FILE, WEIGHTS_FILE, ValidatedAdapter

CANONICAL_FILES = (CONFIG_FILE, WEIGHTS_FILE)  # sorted: the hash order
CHUNK = 1 << 20


def canonical_config_bytes(config: dict) -> bytes:
    return (json.dumps(config, sort_keys=True, indent=2, ensure_ascii=False) + "\n").encode()


def write_canonical(adapter: ValidatedAdapter, out_dir: Path) -> str:
    """Write the canonical files of `adapter` into `out_dir`; return their sha256."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / CONFIG_FILE).write_bytes(canonical_config_bytes(adapter.config))
    shutil.copyfile(adapter.path / WEIGHTS_FILE, out_dir / WEIGHTS_FILE)
    return dir_sha256(out_dir)


def dir_sha256(path: Path) -> str:
    """sha256 over (name, size, bytes) of each canonical file in a fixed order."""
    h = hashlib.sha256()
    for name in CANONICAL_FILES:
        file = path / name
        h.update(f"{name}\n{file.stat().st_size}\n".encode())
        with open(file, "rb") as f:
            while chunk := f.read(CHUNK):
                h.update(chunk)
    return h.hexdigest()
