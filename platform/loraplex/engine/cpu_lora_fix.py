"""A fix for vLLM 0.32's CPU LoRA kernels: base-model tokens in a batch with LoRA requests got
the last GPU slot's adapter.

vLLM marks a token without a LoRA with index -1 and its GPU kernels skip it; the CPU backend's
torch ops (`vllm/lora/ops/torch_ops/lora_ops.py`) index the stacked slot weights with it,
`lora_a_weights[-1]`, which in torch is the *last* slot. So once slot max_loras - 1 holds an
adapter, a base-model request sharing a batch with any adapter request is computed with that
adapter: another tenant's weights (seen in tests/integration/test_adapters.py: the base model
answered as the pirate adapter). A lone base request is safe (punica skips a batch of one -1).

The fix zeroes the shrink output (x @ A) of the -1 tokens, so their expand adds B @ 0 = 0.
Installed in the EngineCore's worker by importing this module (lora_residency, our
worker_extension_cls, imports it); idempotent.
"""

from __future__ import annotations

_PATCHED = "_loraplex_masks_no_lora_tokens"


def masked_shrink(shrink):
    def bgmv_shrink(inputs, lora_b_weights, output_tensor, lora_indices_tensor, scaling: float = 1.0):
        shrink(inputs, lora_b_weights, output_tensor, lora_indices_tensor, scaling)
        no_lora = lora_indices_tensor < 0
        if no_lora.any():
            output_tensor[: no_lora.shape[0]][no_lora] = 0
    setattr(bgmv_shrink, _PATCHED, True)
    return bgmv_shrink


def install() -> bool:
    """Patch vLLM's CPU shrink op where it is looked up; False if already patched or absent."""
    try:
        from vllm.lora.ops.torch_ops import lora_ops
        from vllm.lora.punica_wrapper import punica_cpu
    except ImportError:
        return False
    if getattr(lora_ops.bgmv_shrink, _PATCHED, False):
        return False
    fixed = masked_shrink(lora_ops.bgmv_shrink)
    lora_ops.bgmv_shrink = fixed  # sgmv_shrink (prefill) calls it through the module
    if getattr(punica_cpu, "bgmv_shrink", None) is not None:
        punica_cpu.bgmv_shrink = fixed  # the decode path imported it by name
    import vllm.lora.ops.torch_ops as torch_ops
    if getattr(torch_ops, "bgmv_shrink", None) is not None:
        torch_ops.bgmv_shrink = fixed
    return True
