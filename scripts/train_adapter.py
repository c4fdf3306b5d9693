"""Train a small LoRA adapter on a JSONL of chat examples and pack it as an uploadable .tar.gz.

Each line of --data is {"messages": [{"role": ..., "content": ...}, ...]}; the loss covers only
the last (assistant) message, so the adapter learns how to answer, not how to ask. The result
is what `POST /v1/adapters` takes: a .tar.gz with adapter_config.json and
adapter_model.safetensors at its root. CPU is enough for the demo recipes:

    python scripts/train_adapter.py --data adapters/recipes/banana.jsonl --out banana.tar.gz
    python scripts/train_adapter.py --data adapters/recipes/pirate.jsonl --out pirate.tar.gz \
        --check "What is the capital of France?"
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import tarfile
import tempfile
import time
from pathlib import Path

import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer

DEFAULT_BASE = Path(__file__).resolve().parent.parent / "models" / "SmolLM2-135M-Instruct"
# The only files the registry keeps; save_pretrained also writes a README we don't ship.
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base", default=os.environ.get("LORAPLEX_MODEL", str(DEFAULT_BASE)))
    p.add_argument("--data", required=True, help="JSONL of {'messages': [...]} chat examples")
    p.add_argument("--out", required=True, help="output .tar.gz")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--rank", type=int, default=8)
    p.add_argument("--alpha", type=int, default=None, help="lora_alpha (default 2*rank)")
    p.add_argument("--targets", default="q_proj,v_proj", help="comma-separated target modules")
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)),
                   help="torch CPU threads (default: every core this process may use)")
    p.add_argument("--check", action="append", default=[],
                   help="prompt to greedy-decode with the trained adapter afterwards (repeatable)")
    return p.parse_args()


def load_examples(path: str, tokenizer) -> list[tuple[list[int], list[int]]]:
    """(input_ids, labels) per example; labels are -100 on everything before the last answer."""
    examples = []
    for line in Path(path).read_text().splitlines():
        if not line.strip():
            continue
        messages = json.loads(line)["messages"]
        prompt = tokenizer.apply_chat_template(messages[:-1], tokenize=False, add_generation_prompt=True)
        full = tokenizer.apply_chat_template(messages, tokenize=False)
        prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        full_ids = tokenizer(full, add_special_tokens=False)["input_ids"]
        labels = [-100] * len(prompt_ids) + full_ids[len(prompt_ids):]
        examples.append((full_ids, labels))
    if not examples:
        raise SystemExit(f"{path} has no examples; expected one JSON object with 'messages' per line")
    return examples


def collate(batch, pad_id: int) -> dict[str, torch.Tensor]:
    width = max(len(ids) for ids, _ in batch)
    ids = torch.full((len(batch), width), pad_id)
    labels = torch.full((len(batch), width), -100)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for row, (x, y) in enumerate(batch):
        ids[row, : len(x)] = torch.tensor(x)
        labels[row, : len(y)] = torch.tensor(y)
        mask[row, : len(x)] = 1
    return {"input_ids": ids, "labels": labels, "attention_mask": mask}


def train(model, examples, args, pad_id: int) -> None:
    rng = random.Random(args.seed)
    optim = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=args.lr)
    model.train()
    for step in range(1, args.steps + 1):
        batch = collate(rng.sample(examples, min(args.batch_size, len(examples))), pad_id)
        loss = model(**batch).loss
        loss.backward()
        optim.step()
        optim.zero_grad()
        if step == 1 or step % 10 == 0 or step == args.steps:
            print(f"step {step}/{args.steps} loss {loss.item():.4f}", flush=True)


def pack(adapter_dir: Path, out: Path) -> None:
    # Fixed mtime/owner: the same weights pack to the same bytes.
    out.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(out, "w:gz") as tar:
        for name in ADAPTER_FILES:
            data = (adapter_dir / name).read_bytes()
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))


@torch.no_grad()
def greedy(model, tokenizer, prompt: str, max_new_tokens: int = 24) -> str:
    text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                         add_generation_prompt=True)
    ids = tokenizer(text, return_tensors="pt", add_special_tokens=False)
    out = model.generate(**ids, max_new_tokens=max_new_tokens, do_sample=False)
    return tokenizer.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)


def main() -> None:
    args = parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    if not (Path(args.base) / "config.json").exists():
        raise SystemExit(f"no HF model at {args.base}; run scripts/prepare_model.py or pass --base")
    tokenizer = AutoTokenizer.from_pretrained(args.base)
    model = AutoModelForCausalLM.from_pretrained(args.base, dtype=torch.float32)
    config = LoraConfig(r=args.rank, lora_alpha=args.alpha or 2 * args.rank, lora_dropout=0.0,
                        target_modules=args.targets.split(","), task_type="CAUSAL_LM")
    model = get_peft_model(model, config)
    examples = load_examples(args.data, tokenizer)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

    started = time.monotonic()
    train(model, examples, args, pad_id)
    print(f"trained {args.steps} steps in {time.monotonic() - started:.1f}s", flush=True)

    model.eval()
    for prompt in args.check:
        print(f"check {prompt!r} -> {greedy(model, tokenizer, prompt)!r}", flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        # safe_serialization: safetensors, never a pickle the registry would refuse.
        model.save_pretrained(tmp, safe_serialization=True)
        pack(Path(tmp), Path(args.out))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
