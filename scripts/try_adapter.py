"""Greedy-decode prompts with the base model and with an adapter archive, side by side.

The archive goes through the registry's own extraction and validation first, so a pass here
also means `POST /v1/adapters` would accept it. No vLLM: transformers + peft on CPU.

    python scripts/try_adapter.py --adapter banana.tar.gz "What is the capital of France?"
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer

from loraplex.engine.config import EngineConfig
from loraplex.registry.archive import extract_archive
from loraplex.registry.model_spec import BaseModelSpec
from loraplex.registry.validator import AdapterValidator
# scripts/ is on sys.path when this file runs as a script.
from train_adapter import greedy

DEFAULT_BASE = Path(__file__).resolve().parent.parent / "models" / "SmolLM2-135M-Instruct"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base", default=os.environ.get("LORAPLEX_MODEL", str(DEFAULT_BASE)))
    p.add_argument("--adapter", required=True, help=".tar.gz / .zip of a PEFT LoRA dir")
    p.add_argument("--max-new-tokens", type=int, default=24)
    p.add_argument("prompts", nargs="+")
    args = p.parse_args()

    tokenizer = AutoTokenizer.from_pretrained(args.base)
    model = AutoModelForCausalLM.from_pretrained(args.base, dtype=torch.float32).eval()
    base_out = [greedy(model, tokenizer, q, args.max_new_tokens) for q in args.prompts]

    with tempfile.TemporaryDirectory() as tmp:
        peft_dir = extract_archive(Path(args.adapter), Path(tmp))
        validator = AdapterValidator(BaseModelSpec.from_pretrained_dir(args.base),
                                     max_lora_rank=EngineConfig().max_lora_rank)  # the served default
        adapter = validator.validate(peft_dir)
        print(f"valid: rank {adapter.rank}, targets {adapter.target_modules}")
        model = PeftModel.from_pretrained(model, str(peft_dir)).eval()
        lora_out = [greedy(model, tokenizer, q, args.max_new_tokens) for q in args.prompts]

    for prompt, base, lora in zip(args.prompts, base_out, lora_out):
        print(f"prompt:  {prompt!r}\n  base:    {base!r}\n  adapter: {lora!r}")


if __name__ == "__main__":
    main()
