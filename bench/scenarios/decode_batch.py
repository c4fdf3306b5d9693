"""The engine's own decode step against its batch: what any scheduler in front of it can win.

vLLM alone (no Ray, no platform), the shipped engine args from serve_config.yaml, the served CPU
LoRA ops (the Engine replica's worker extension), one OMP thread as `num_cpus: 1` gives the
replica. Every request decodes exactly --tokens tokens (greedy, ignore_eos) from a short prompt;
a batch of B such requests started together gives the step time at B (prefill included, 1-2 % of
the steps). Two tables:

- base model, B = 1..16: step ms, output tok/s; and for a fixed dispatch limit N, what a light
  tenant's request pays decoding beside N backlogged ones (step(N+1) / step(1)), and the share
  of "W alone" the backlogged tenant keeps when the light one takes a slot of the N+1
  ((N/(N+1)) x tok/s(N+1) / tok/s(N)): issue 20's two noisy-neighbour targets (M <= 2x, W >= 0.9x)
  read from the engine itself, before queueing, prefills or the platform add anything; then the
  light tenant's own prompts (--prompt-tokens, one every 2 s), which the others wait for too;
- LoRA, a batch of 8 and 16: base, one adapter, 4 distinct adapters (what residency-aware
  placement can at best turn into one per replica, issue 22): step ms and tok/s.

    python -m bench decode_batch [--tokens 64] [--threads 1] [--prompt-tokens 130]
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import yaml

from bench.processes import ROOT
from bench.report import Table
BATCHES = (1, 2, 4, 5, 6, 8, 9, 10, 12, 16)
LIMITS = (4, 5, 8, 9)  # dispatch limits N whose N + 1 is in BATCHES


def random_adapter(base: str, out: Path, seed: int) -> Path:
    """A rank-16 LoRA on every linear layer with random (non-zero) weights: the served cost of any adapter."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(base),
                           LoraConfig(r=16, lora_alpha=32, target_modules=targets, init_lora_weights=False))
    model.save_pretrained(out)
    return out


def step_ms(llm, sp, prompts, loras=None) -> float:
    t = time.perf_counter()
    llm.generate(prompts, sp, lora_request=loras, use_tqdm=False)
    return (time.perf_counter() - t) / sp.max_tokens * 1000


def add_arguments(p) -> None:
    p.add_argument("--tokens", type=int, default=64, help="tokens each request decodes")
    p.add_argument("--threads", type=int, default=1, help="OMP threads (the Engine replica's num_cpus)")
    p.add_argument("--prompt-tokens", type=int, default=130, help="the light tenant's prompt (about)")


def run(args, out) -> None:
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")  # as the Engine replica sets it

    from vllm import LLM, SamplingParams
    from vllm.lora.request import LoRARequest

    from loraplex.engine.config import EngineConfig
    from loraplex.engine.lora_residency import EXTENSION

    shipped = yaml.safe_load((ROOT / "serve_config.yaml").read_text())["applications"][0]["args"]["engine"]
    engine_args = EngineConfig(**{**shipped, "model": str(ROOT / shipped["model"])}).engine_args()
    engine_args["worker_extension_cls"] = EXTENSION  # the served grouped CPU LoRA ops
    with tempfile.TemporaryDirectory(prefix="decode-batch-") as tmp:
        adapters = [random_adapter(engine_args["model"], Path(tmp) / f"a{i}", i) for i in range(4)]
        measure(args, out, LLM(**engine_args), SamplingParams, LoRARequest, adapters)


def measure(args, out, llm, SamplingParams, LoRARequest, adapters) -> None:
    sp = SamplingParams(max_tokens=args.tokens, ignore_eos=True, temperature=0)
    prompts = [f"Write a long story about the number {i}." for i in range(32)]
    step_ms(llm, sp, prompts[:4])  # warm-up

    base = {b: step_ms(llm, sp, prompts[:b]) for b in BATCHES}
    out.table(Table(f"base model, {args.tokens} tokens per request, {args.threads} OMP thread(s)",
                    [("batch", "batch", "{:d}"), ("step_ms", "step ms", "{:.1f}"), ("tok_s", "out tok/s", "{:.1f}"),
                     ("vs_one", "step / step(1)", "{:.2f}x")],
                    [{"batch": b, "step_ms": ms, "tok_s": b * 1000 / ms, "vs_one": ms / base[1]} for b, ms in base.items()]))
    # W keeps N of the N+1 sequences: (N/(N+1)) x tok/s(N+1) / tok/s(N) = step(N) / step(N+1).
    kept = {n: base[n] / base[n + 1] for n in LIMITS}
    out.table(Table("", [("n", "dispatch limit N", "{:d}"),
                         ("light", "light request's decode beside N (step(N+1) / step(1))", "{:.2f}x"),
                         ("kept", "backlogged tenant's share of alone (N/(N+1) x tok/s(N+1) / tok/s(N))", "{:.2f}x")],
                    [{"n": n, "light": base[n + 1] / base[1], "kept": kept[n]} for n in LIMITS]))

    # A light tenant's request costs the others its prompt too: a ShareGPT opening is ~130 tokens
    # with the chat template (bench/fairness.py's prompts). Its prefill, timed alone:
    long_prompt = " ".join(f"word{i}" for i in range(args.prompt_tokens // 3))  # ~3 tokens a word
    one = SamplingParams(max_tokens=1, temperature=0)
    n_tokens = len(llm.get_tokenizer()(long_prompt)["input_ids"])
    t = time.perf_counter()
    llm.generate([long_prompt + f" {i}" for i in range(4)], one, use_tqdm=False)
    # What the prompt adds to the step it rides in (a step of the batch runs anyway).
    prefill_ms = (time.perf_counter() - t) / 4 * 1000 - base[1]
    every_s = 2.0
    prefill_share = prefill_ms / 1000 / every_s
    out.table(Table(f"prefill of a {n_tokens}-token prompt, beyond a decode step: {prefill_ms:.0f} ms; one every "
                    f"{every_s:.0f} s takes {prefill_share:.0%} of the engine's time",
                    [("n", "dispatch limit N", "{:d}"),
                     ("kept", "backlogged tenant's share of alone, after the light tenant's prefills", "{:.2f}x")],
                    [{"n": n, "kept": kept[n] * (1 - prefill_share)} for n in LIMITS]))

    requests = [LoRARequest(f"a{i}", i + 1, str(path)) for i, path in enumerate(adapters)]
    lora = Table("", [("batch", "batch", "{:d}"), ("adapters", "adapters"), ("step_ms", "step ms", "{:.1f}"),
                      ("tok_s", "out tok/s", "{:.1f}"), ("vs_base", "vs base", "{:.2f}x")])
    step_ms(llm, sp, prompts[:4], [requests[i % 4] for i in range(4)])  # loads the 4 slots
    for b in (8, 16):
        for label, loras in (("one", [requests[0]] * b), ("4 distinct", [requests[i % 4] for i in range(b)])):
            ms = step_ms(llm, sp, prompts[:b], loras)
            lora.add(batch=b, adapters=label, step_ms=ms, tok_s=b * 1000 / ms, vs_base=base[b] / ms)
        lora.add(batch=b, adapters="none (base)", step_ms=base[b], tok_s=b * 1000 / base[b], vs_base=1.0)
    out.table(lora)
