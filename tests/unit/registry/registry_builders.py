"""Builders for synthetic LoRA adapters and hand-made archives used by the registry tests.

Adapters are constants of the right shapes instead of trained weights: validation looks at
names, shapes and config, and that some lora_B @ lora_A is nonzero (an all-zero adapter cannot
change the output and is refused), so tests stay fast and need no model files.
"""

from __future__ import annotations

import io
import json
import tarfile
import zipfile
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from loraplex.registry.model_spec import BaseModelSpec

REPO = Path(__file__).resolve().parents[3]

# The served default model's config.json, as far as adapter shapes depend on it.
SMOLLM2_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 576,
    "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
    "num_key_value_heads": 3, "head_dim": 64, "vocab_size": 49152, "tie_word_embeddings": True,
}


def lora_tensors(spec: BaseModelSpec, r: int = 8, modules=("q_proj", "v_proj"), layers: int | None = None,
                 fill: float = 0.01, b_fill: float | None = None) -> dict[str, np.ndarray]:
    """`fill` in every tensor (lora_B: `b_fill` if given; 0 is the untrained adapter peft starts with)."""
    tensors = {}
    for i in range(spec.num_layers if layers is None else layers):
        for m in modules:
            in_f, out_f = spec.linear_shapes()[m]
            prefix = f"base_model.model.model.layers.{i}.{spec.parent_of(m)}.{m}"
            tensors[f"{prefix}.lora_A.weight"] = np.full((r, in_f), fill, dtype=np.float32)
            b = fill if b_fill is None else b_fill
            tensors[f"{prefix}.lora_B.weight"] = np.full((out_f, r), b, dtype=np.float32)
    return tensors

def lora_config(r: int = 8, modules=("q_proj", "v_proj"), **overrides) -> dict:
    config = {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": r, "lora_alpha": 2 * r,
        "target_modules": modules if isinstance(modules, str) else list(modules), "lora_dropout": 0.0, "bias": "none",
        "base_model_name_or_path": "HuggingFaceTB/SmolLM2-135M-Instruct",
        "modules_to_save": None, "use_dora": False,
    }
    config.update(overrides)
    return config

def write_adapter(path: Path, config: dict | str | None, tensors: dict | bytes | None) -> Path:
    """A PEFT dir; a str config or bytes tensors are written verbatim (for corrupt cases)."""
    path.mkdir(parents=True, exist_ok=True)
    if config is not None:
        text = config if isinstance(config, str) else json.dumps(config)
        (path / "adapter_config.json").write_text(text)
    if isinstance(tensors, bytes):
        (path / "adapter_model.safetensors").write_bytes(tensors)
    elif tensors is not None:
        save_file(tensors, str(path / "adapter_model.safetensors"))
    return path

def tar_dir(src: Path, out: Path, prefix: str = "") -> Path:
    with tarfile.open(out, "w:gz") as tar:
        for f in sorted(src.iterdir()):
            tar.add(f, arcname=f"{prefix}{f.name}")
    return out

def zip_dir(src: Path, out: Path, prefix: str = "") -> Path:
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zf:
        for f in sorted(src.iterdir()):
            zf.write(f, f"{prefix}{f.name}")
    return out

def tar_entries(out: Path, entries: list[tarfile.TarInfo | tuple[str, bytes]]) -> Path:
    """A .tar.gz from raw members: (name, data) for files, TarInfo for anything else."""
    with tarfile.open(out, "w:gz", format=tarfile.GNU_FORMAT) as tar:
        for e in entries:
            if isinstance(e, tarfile.TarInfo):
                tar.addfile(e)
            else:
                info = tarfile.TarInfo(e[0])
                info.size = len(e[1])
                tar.addfile(info, io.BytesIO(e[1]))
    return out
