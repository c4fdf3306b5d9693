"""Base models side by side (issue 35): engine memory, output tok/s and greedy agreement with the
full default base, each base in vLLM's offline `LLM` with the platform's engine args.

Each base runs in a child process of its own, one after the other (never two engines at once), so
its RSS is that engine's alone: the CPU backend with VLLM_ENABLE_V1_MULTIPROCESSING=0 keeps the
EngineCore and its worker in the child. Per base:

- memory: the child's resident set after the runs (VmRSS) and its peak (VmHWM), and the same
  less the KV cache vLLM allocated (gpu_memory_utilization is a share of host RAM on CPU, the
  same for every base, so it would hide the weights' difference);
- throughput: output tok/s of one batch of --batch fixed prompts x --tokens tokens, greedy,
  ignore_eos (every request makes exactly --tokens), the median of --repeats timed runs after a
  warm-up;
- prefill: input tok/s of --prefill-prompts prompts of exactly --prefill-len tokens (ShareGPT
  text under the chat template, cut), one output token each, after the throughput runs;
- agreement: greedy --agree-tokens tokens for --agree-prompts prompts (ShareGPT's first questions
  under the chat template), compared with the first base's: the share of prompts whose tokens
  match exactly, and the mean length of the common prefix;
- LoRA: with --adapter RECIPE, the same agreement prompts once more with that demo adapter
  (bench/demo_adapters.py trains it once) on every base whose engine takes LoRA, compared with
  the first base's answers under the same adapter.

    flock /tmp/loraplex-bench.lock python -m bench base_models --adapter pirate

A base is NAME=PATH:DTYPE[:nolora] (PATH relative to the checkout); the first is the reference.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.processes import ROOT
from bench.report import Table

DEFAULT_BASES = [
    "full=models/SmolLM2-135M-Instruct:float32",
    "full-bf16=models/SmolLM2-135M-Instruct:bfloat16",
    "w4a16=models/SmolLM2-135M-Instruct-W4A16:bfloat16",
    "w8a8=models/SmolLM2-135M-Instruct-W8A8:float32:nolora",
]
# The platform's engine args (serve_config.yaml) but dtype, which each base names.
ENGINE_ARGS = dict(max_model_len=2048, max_num_seqs=32, max_loras=4, max_lora_rank=16,
                   gpu_memory_utilization=0.12, tensor_parallel_size=1)
MAX_PROMPT_TOKENS = 384


def parse_base(spec: str) -> dict:
    name, _, rest = spec.partition("=")
    parts = rest.split(":")
    if not name or len(parts) < 2:
        raise SystemExit(f"a base is NAME=PATH:DTYPE[:nolora], got {spec!r}")
    return {"name": name, "path": str((ROOT / parts[0]).resolve()), "dtype": parts[1],
            "lora": "nolora" not in parts[2:]}


def fixed_prompts(tokenizer, n: int) -> list[list[int]]:
    """The first n ShareGPT opening questions that fit MAX_PROMPT_TOKENS, as chat-template ids."""
    from sharegpt import first_exchanges, sharegpt_conversations

    out: list[list[int]] = []
    for ex in first_exchanges(sharegpt_conversations(20 * n)):
        ids = tokenizer.apply_chat_template([{"role": "user", "content": ex.question}],
                                            add_generation_prompt=True, tokenize=True)
        if hasattr(ids, "keys"):
            ids = ids["input_ids"]
        if len(ids) <= MAX_PROMPT_TOKENS:
            out.append(list(ids))
        if len(out) == n:
            return out
    raise SystemExit(f"only {len(out)} ShareGPT questions fit {MAX_PROMPT_TOKENS} tokens")


def long_prompts(tokenizer, n: int, length: int) -> list:
    """n prompts of exactly `length` tokens: ShareGPT questions and answers run together, cut."""
    from sharegpt import first_exchanges, sharegpt_conversations
    from vllm.inputs import TokensPrompt

    text = "\n".join(ex.question + "\n" + ex.answer
                     for ex in first_exchanges(sharegpt_conversations(40 * n)))
    ids = tokenizer(text)["input_ids"]
    if len(ids) < n * length:
        raise SystemExit(f"ShareGPT's first conversations hold {len(ids)} tokens, need {n * length}")
    return [TokensPrompt(prompt_token_ids=ids[i * length:(i + 1) * length]) for i in range(n)]


def proc_status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def kv_cache_bytes(llm) -> int:
    """What vLLM allocated for the KV cache: blocks x block size x layers x K and V."""
    cfg = llm.llm_engine.vllm_config
    mc = cfg.model_config
    hf = mc.hf_text_config
    layers = hf.num_hidden_layers
    kv_heads = getattr(hf, "num_key_value_heads", hf.num_attention_heads)
    head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
    import torch

    elem = torch.tensor([], dtype=mc.dtype).element_size()
    cc = cfg.cache_config
    return cc.num_gpu_blocks * cc.block_size * layers * 2 * kv_heads * head_dim * elem


def child(args) -> None:
    """One base in this process: print its JSON record on the last line of stdout."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    base = json.loads(args.child)
    rec: dict = {"name": base["name"], "path": base["path"], "dtype": base["dtype"]}
    t0 = time.perf_counter()
    from loraplex.engine.lora_residency import EXTENSION

    # With LoRA, the Engine's worker extension: it installs the platform's CPU LoRA ops (cpu_lora_ops).
    extension = {"worker_extension_cls": EXTENSION} if base["lora"] else {}
    llm = LLM(model=base["path"], dtype=base["dtype"], enable_lora=base["lora"], seed=0, **extension,
              **ENGINE_ARGS)
    rec["startup_s"] = time.perf_counter() - t0
    quant = llm.llm_engine.vllm_config.model_config.quantization
    rec["quantization"] = quant or "none"
    tok = llm.get_tokenizer()

    batch = [TokensPrompt(prompt_token_ids=p) for p in fixed_prompts(tok, args.batch)]
    timed = SamplingParams(temperature=0, max_tokens=args.tokens, ignore_eos=True)
    llm.generate(batch[:2], SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)
    runs = []
    for _ in range(args.repeats):
        t = time.perf_counter()
        outs = llm.generate(batch, timed, use_tqdm=False)
        dt = time.perf_counter() - t
        runs.append(sum(len(o.outputs[0].token_ids) for o in outs) / dt)
    rec["tok_s_runs"] = runs
    rec["tok_s"] = statistics.median(runs)

    if args.prefill_prompts:
        long = long_prompts(tok, args.prefill_prompts, args.prefill_len)
        t = time.perf_counter()
        llm.generate(long, SamplingParams(temperature=0, max_tokens=1), use_tqdm=False)
        rec["prefill_tok_s"] = args.prefill_prompts * args.prefill_len / (time.perf_counter() - t)

    agree = [TokensPrompt(prompt_token_ids=p) for p in fixed_prompts(tok, args.agree_prompts)]
    greedy = SamplingParams(temperature=0, max_tokens=args.agree_tokens)
    rec["answers"] = [list(o.outputs[0].token_ids) for o in llm.generate(agree, greedy, use_tqdm=False)]
    rec["sample"] = tok.decode(rec["answers"][0])

    if args.adapter_dir:
        if not base["lora"]:
            rec["lora"] = "not tried (nolora)"
        else:
            from vllm.lora.request import LoRARequest

            lora = LoRARequest("bench-adapter", 1, args.adapter_dir)
            try:
                outs = llm.generate(agree[:args.lora_prompts or None], greedy, lora_request=lora, use_tqdm=False)
                rec["lora_answers"] = [list(o.outputs[0].token_ids) for o in outs]
                rec["lora_sample"] = tok.decode(rec["lora_answers"][0])
                rec["lora"] = "yes"
            except Exception as e:  # noqa: BLE001 - reported in the table
                rec["lora"] = f"failed: {type(e).__name__}: {e}"[:200]

    rec["kv_cache_bytes"] = kv_cache_bytes(llm)
    rec["rss_bytes"] = proc_status_kib("VmRSS") * 1024
    rec["peak_rss_bytes"] = proc_status_kib("VmHWM") * 1024
    print("BENCH_RECORD " + json.dumps(rec), flush=True)


def run_child(base: dict, args, adapter_dir: str | None, log) -> dict:
    argv = [sys.executable, "-m", "bench", "base_models", "--child", json.dumps(base), "--batch", str(args.batch),
            "--tokens", str(args.tokens), "--repeats", str(args.repeats),
            "--agree-prompts", str(args.agree_prompts), "--agree-tokens", str(args.agree_tokens),
            "--prefill-prompts", str(args.prefill_prompts), "--prefill-len", str(args.prefill_len),
            "--lora-prompts", str(args.lora_prompts)]
    if adapter_dir:
        argv += ["--adapter-dir", adapter_dir]
    proc = subprocess.run(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=log, text=True)
    record = None
    for line in proc.stdout.splitlines():
        if line.startswith("BENCH_RECORD "):
            record = json.loads(line[len("BENCH_RECORD "):])
        else:
            log.write(line + "\n")  # vLLM logs to stdout
    log.flush()
    if record is not None:
        return record
    return {"name": base["name"], "path": base["path"], "dtype": base["dtype"],
            "error": f"exit {proc.returncode} (see the log)"}


def agreement(answers: list[list[int]], reference: list[list[int]]) -> tuple[float, float]:
    """(share of prompts whose tokens equal the reference's, mean common-prefix length)."""
    exact, prefix = 0, []
    for a, r in zip(answers, reference):
        exact += a == r
        n = 0
        while n < min(len(a), len(r)) and a[n] == r[n]:
            n += 1
        prefix.append(n)
    return exact / len(reference), sum(prefix) / len(prefix)


def extract_adapter(recipe: str, into: Path) -> str:
    import tarfile

    from bench.demo_adapters import trained_adapter

    with tarfile.open(trained_adapter(recipe)) as tar:
        tar.extractall(into, filter="data")
    return str(into)


def report(out, recs: list[dict], args) -> None:
    ref = recs[0]
    table = Table(f"{args.batch} prompts x {args.tokens} tokens greedy (ignore_eos), median of "
                  f"{args.repeats}; prefill: {args.prefill_prompts} x {args.prefill_len} tokens; agreement: "
                  f"{args.agree_prompts} prompts x {args.agree_tokens} greedy tokens vs `{ref['name']}`"
                  + (f"; LoRA: demo adapter `{args.adapter}` on the first {args.lora_prompts or args.agree_prompts} prompts"
                     if args.adapter else ""),
                  [("name", "base"), ("quantization", "quantization"), ("dtype", "dtype"),
                   ("rss_gib", "RSS GiB", "{:.2f}"), ("peak_rss_gib", "peak RSS GiB", "{:.2f}"),
                   ("weights_gib", "RSS less KV cache GiB", "{:.2f}"), ("tok_s", "output tok/s", "{:.1f}"),
                   ("prefill_tok_s", "prefill tok/s", "{:.0f}"), ("exact", "exact match", "{:.0%}"),
                   ("prefix", "mean prefix (tokens)", "{:.1f}"), ("lora", "LoRA"),
                   ("lora_exact", "LoRA exact match", "{:.0%}"), ("lora_prefix", "LoRA mean prefix", "{:.1f}")])
    for r in recs:
        if "error" in r:
            table.add(name=r["name"], dtype=r["dtype"], quantization=f"error: {r['error']}")
            continue
        ex, pre = agreement(r["answers"], ref["answers"])
        lex = lpre = None
        if "lora_answers" in r and "lora_answers" in ref:
            lex, lpre = agreement(r["lora_answers"], ref["lora_answers"])
        table.add(name=r["name"], quantization=r["quantization"], dtype=r["dtype"], rss_gib=r["rss_bytes"] / 2**30,
                  peak_rss_gib=r["peak_rss_bytes"] / 2**30, weights_gib=(r["rss_bytes"] - r["kv_cache_bytes"]) / 2**30,
                  tok_s=r["tok_s"], prefill_tok_s=r.get("prefill_tok_s"), exact=ex, prefix=pre, lora=r.get("lora"),
                  lora_exact=lex, lora_prefix=lpre)
    out.table(table)
    for r in recs[1:]:
        if "error" in r or "error" in ref:
            continue
        out.note(
            f"- {r['name']} / {ref['name']}: output tok/s x{r['tok_s'] / ref['tok_s']:.2f}, "
            f"prefill tok/s x{r.get('prefill_tok_s', float('nan')) / ref.get('prefill_tok_s', float('nan')):.2f}, "
            f"RSS less KV cache x{(r['rss_bytes'] - r['kv_cache_bytes']) / (ref['rss_bytes'] - ref['kv_cache_bytes']):.2f}")
    for r in recs:
        if "sample" in r:
            out.note(f"- {r['name']}, first answer: {r['sample'][:160]!r}")
            if "lora_sample" in r:
                out.note(f"- {r['name']} + adapter, first answer: {r['lora_sample'][:160]!r}")


def add_arguments(parser) -> None:
    parser.add_argument("--base", action="append", default=None,
                        help="NAME=PATH:DTYPE[:nolora], repeatable; the first is the reference "
                             f"(default: {' '.join(DEFAULT_BASES)})")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--prefill-prompts", type=int, default=4)
    parser.add_argument("--prefill-len", type=int, default=1024)
    parser.add_argument("--agree-prompts", type=int, default=32)
    parser.add_argument("--agree-tokens", type=int, default=32)
    parser.add_argument("--adapter", default=None, help="a demo adapter recipe (adapters/recipes)")
    parser.add_argument("--lora-prompts", type=int, default=0,
                        help="the LoRA agreement on the first N agreement prompts (0: all of them)")
    parser.add_argument("--log", type=Path, default=Path(tempfile.gettempdir()) / "bench_base_models.log")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--adapter-dir", default=None, help=argparse.SUPPRESS)


def run(args, out) -> None:
    if args.child:
        child(args)
        return
    bases = [parse_base(s) for s in (args.base or DEFAULT_BASES)]
    with tempfile.TemporaryDirectory() as tmp, open(args.log, "w") as log:
        adapter_dir = extract_adapter(args.adapter, Path(tmp)) if args.adapter else None
        recs = []
        for b in bases:
            print(f"base_models: {b['name']} ({b['path']}, {b['dtype']})", file=sys.stderr)
            recs.append(run_child(b, args, adapter_dir, log))
    out.data["records"] = recs  # every base's answers too, with --json
    report(out, recs, args)
