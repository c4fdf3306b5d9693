"""vLLM 0.32's CPU LoRA ops, grouped by adapter: one matmul per adapter in the batch instead of a
copy of every token's adapter weights, and no adapter for base-model tokens.

vLLM's CPU backend runs the torch ops of `vllm/lora/ops/torch_ops/lora_ops.py`. Each computes
every token's LoRA product as `einsum("bi,boi->bo", x, W[indices])`, so it first gathers one
(out x in) weight matrix per token out of the stacked slots. For one rank-16 projection of
SmolLM2's MLP (1536 x 16 floats) that is ~100 KB copied per token per layer and slice: a
500-token prompt copies ~50 MB for each of them, and a 16-sequence decode step does it for every
projection of every layer. That copy, not the arithmetic, is why a LoRA request ran at
0.14-0.17x of a base one here (docs/benchmarks.md). The ops below give the same products with
`x[rows] @ W[slot].T` per distinct slot in the batch (usually one or two), which is what the
GPU kernels do in spirit (they read the slot's weights in place).

They also mend a fault of the originals: vLLM marks a token without a LoRA with index -1 and its
GPU kernels skip it, but `W[-1]` in torch is the *last* slot, so once slot max_loras - 1 held an
adapter, a base-model request batched with any adapter request was computed with that adapter:
another tenant's weights (seen in tests/integration/test_adapters.py). Here -1 rows get none.

Installed in vLLM's worker process by importing this module (lora_residency, our
worker_extension_cls, imports it and calls install()); idempotent. The sgmv (prefill) ops expand
their per-sequence indices and call the bgmv ops through their module, so patching the three
bgmv ops covers both paths. GPU backends use the triton kernels and never call these.
"""

from __future__ import annotations

import torch

def lora_product(inputs: torch.Tensor, weights: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """Row i of the result is `weights[indices[i]] @ inputs[i]` (zero where indices[i] < 0), what the
    original ops' einsum over gathered weights gives, without the gather. Computed in the weights'
    dtype, which is the engine's (vLLM stacks adapters in the model's dtype): vLLM's ops compute in
    the output's, and the shrink's output is a float32 buffer, so in a bfloat16 engine they copied
    each slot's weights to float32 on every call and left bf16 arithmetic unused. The caller
    stores the result into its output, in the output's dtype."""
    w = weights.squeeze(1) if weights.dim() == 4 else weights  # (slots, out, in)
    x = inputs.to(w.dtype)
    n = indices.shape[0]
    if n == 0:
        return x.new_zeros((0, w.shape[1]))
    first, last = int(indices.min()), int(indices.max())
    if first == last:  # every row on one slot (or none): the usual batch here
        return x.new_zeros((n, w.shape[1])) if first < 0 else x @ w[first].T
    out = x.new_zeros((n, w.shape[1]))
    for slot, rows in _groups(indices):
        out.index_copy_(0, rows, x.index_select(0, rows) @ w[slot].T)
    return out


_last_groups: list = [None, []]  # the last mixed batch's indices and its groups


def _groups(indices: torch.Tensor) -> list[tuple[int, torch.Tensor]]:
    """(slot, its rows) for each adapter slot in a mixed batch. A step calls the ops with the
    same indices for every projection of every layer, so the grouping is kept for the next call
    while the indices are equal (compared, not assumed: vLLM updates them in place)."""
    last, groups = _last_groups
    if last is not None and last.shape == indices.shape and torch.equal(last, indices):
        return groups
    groups = [(slot, (indices == slot).nonzero().squeeze(1)) for slot in torch.unique(indices).tolist() if slot >= 0]
    _last_groups[:] = [indices.clone(), groups]
    return groups


def bgmv_shrink(inputs, lora_b_weights, output_tensor, lora_indices_tensor, scaling: float = 1.0):
    outputs = lora_product(inputs, lora_b_weights, lora_indices_tensor)
    output_tensor[:, : outputs.shape[1]] = scaling * outputs[:]


def bgmv_expand(inputs, lora_b_weights, output_tensor, lora_indices_tensor, add_inputs: bool = True):
    outputs = lora_product(inputs, lora_b_weights, lora_indices_tensor)
    limit = output_tensor.shape[0]  # the original's handling of a one-row input, kept as it is
    if outputs.shape[0] == 1 and output_tensor.shape[0] != 1:
        limit = 1
    common_len = min(outputs.shape[1], output_tensor.shape[1])  # adapter and model may pad differently
    if add_inputs:
        output_tensor[:, :common_len] += outputs[:limit, :common_len]
    else:
        output_tensor[:, :common_len] = outputs[:limit, :common_len]


def bgmv_expand_slice(inputs, lora_b_weights, output_tensor, lora_indices_tensor, slice_offset: int,
                      slice_size: int, add_inputs: bool = True):
    outputs = lora_product(inputs, lora_b_weights, lora_indices_tensor)
    if add_inputs:
        output_tensor[:, slice_offset: slice_offset + slice_size] += outputs[:]
    else:
        output_tensor[:, slice_offset: slice_offset + slice_size] = outputs[:]


GROUPED = {"bgmv_shrink": bgmv_shrink, "bgmv_expand": bgmv_expand, "bgmv_expand_slice": bgmv_expand_slice}
VLLM_OPS: dict = {}  # vLLM's own ops, as install() found them (tests and bench_cpu_lora_ops compare)


def install() -> bool:
    """Put the grouped ops wherever vLLM looks them up; False if already there or vLLM has none."""
    try:
        from vllm.lora.ops.torch_ops import lora_ops
        from vllm.lora.punica_wrapper import punica_cpu
    except ImportError:
        return False
    if lora_ops.bgmv_shrink is bgmv_shrink:
        return False
    import vllm.lora.ops.torch_ops as torch_ops
    for name, op in GROUPED.items():
        VLLM_OPS[name] = getattr(lora_ops, name)
        for module in (lora_ops, punica_cpu, torch_ops):  # sgmv_* call lora_ops' by name; the others imported them
            if getattr(module, name, None) is not None:
                setattr(module, name, op)
    return True
