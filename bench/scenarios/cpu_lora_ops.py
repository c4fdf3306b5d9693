"""The CPU LoRA ops, vLLM 0.32's against LoRAPlex's grouped ones (engine/cpu_lora_ops.py), side
by side in one run: milliseconds of LoRA work in one forward pass of the served model.

vLLM wraps every linear layer of the model with LoRA when LoRA is on, whatever modules an
adapter targets, and runs a shrink (x @ A) and an expand (. @ B) per slice of each, at the
engine's max_lora_rank, on every step that has a LoRA token: this times exactly those calls, on
the model's own shapes (read from its config.json), one thread as the Engine replica runs
(`num_cpus: 1`).

    python -m bench cpu_lora_ops [--model models/SmolLM2-135M-Instruct] [--rank 16] [--repeats 3]
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

from bench.processes import ROOT
from bench.report import Table

SLOTS = 4  # the shipped max_loras
# name: the slot of each token in the batch (a step's batch); -1 is a base-model token
SCENARIOS = {
    "decode, 1 sequence": [0],
    "decode, 8 sequences, 1 adapter": [0] * 8,
    "decode, 32 sequences, 1 adapter": [0] * 32,
    "decode, 32 sequences, 4 adapters": [i % 4 for i in range(32)],
    "decode, 32 sequences, half base": [(i % 2) - 1 for i in range(32)],
    "prefill, 512 tokens, 1 adapter": [0] * 512,
    "prefill, 2048 tokens, 4 adapters": [i * 4 // 2048 for i in range(2048)],
}


def projections(config: dict) -> list[tuple[int, list[int]]]:
    """(input size, output slice sizes) of each LoRA-wrapped linear layer in one decoder layer."""
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    head = config.get("head_dim") or hidden // config["num_attention_heads"]
    kv = head * config.get("num_key_value_heads", config["num_attention_heads"])
    return [(hidden, [head * config["num_attention_heads"], kv, kv]),  # qkv_proj
            (head * config["num_attention_heads"], [hidden]),           # o_proj
            (hidden, [inter, inter]),                                   # gate_up_proj
            (inter, [hidden])]                                          # down_proj


def forward_ms(ops: dict, config: dict, rank: int, indices, repeats: int) -> float:
    """Median ms of one forward pass's LoRA ops (every layer) with these ops."""
    import torch

    n = indices.shape[0]
    layers = []
    for d_in, slices in projections(config):
        a = [torch.randn(SLOTS, 1, rank, d_in) * 0.01 for _ in slices]
        b = [torch.randn(SLOTS, 1, s, rank) * 0.01 for s in slices]
        layers.append((torch.randn(n, d_in), a, b, slices, torch.zeros(n, sum(slices))))
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        for _layer in range(config["num_hidden_layers"]):
            for x, a, b, slices, y in layers:
                offset = 0
                for a_i, b_i, size in zip(a, b, slices):
                    shrunk = torch.zeros(n, rank)
                    ops["bgmv_shrink"](x, a_i, shrunk, indices, 1.0)
                    ops["bgmv_expand_slice"](shrunk, b_i, y, indices, offset, size, True)
                    offset += size
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def add_arguments(p) -> None:
    p.add_argument("--model", type=Path, default=ROOT / "models" / "SmolLM2-135M-Instruct")
    p.add_argument("--rank", type=int, default=16, help="the engine's max_lora_rank (vLLM stacks at it)")
    p.add_argument("--repeats", type=int, default=3)


def run(args, out) -> None:
    import torch  # here, not when the entry point lists or parses the scenarios

    from loraplex.engine import cpu_lora_ops

    torch.set_num_threads(1)
    config = json.loads((args.model / "config.json").read_text())
    from vllm.lora.ops.torch_ops import lora_ops
    vllm_ops = {name: getattr(lora_ops, name) for name in cpu_lora_ops.GROUPED}
    assert not set(vllm_ops.values()) & set(cpu_lora_ops.GROUPED.values()), "vLLM's ops are already replaced"
    table = Table(f"{args.model.name}: {config['num_hidden_layers']} layers, rank {args.rank}, {SLOTS} slots, "
                  f"1 thread; median of {args.repeats} forward passes",
                  [("batch", "batch"), ("tokens", "tokens", "{:d}"), ("vllm_ms", "vLLM's ops ms", "{:.1f}"),
                   ("grouped_ms", "grouped ms", "{:.1f}"), ("ratio", "vLLM's / grouped", "{:.1f}x")])
    for name, slots in SCENARIOS.items():
        indices = torch.tensor(slots)
        theirs = forward_ms(vllm_ops, config, args.rank, indices, args.repeats)
        mine = forward_ms(cpu_lora_ops.GROUPED, config, args.rank, indices, args.repeats)
        table.add(batch=name, tokens=len(slots), vllm_ms=theirs, grouped_ms=mine, ratio=theirs / mine)
    out.table(table)
