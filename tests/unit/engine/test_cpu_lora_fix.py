"""vLLM 0.32's CPU LoRA ops index the slot weights with -1 for base-model tokens, which torch
reads as the last slot: cpu_lora_fix masks those tokens (the real vLLM op, patched)."""

import torch

from loraplex.engine import cpu_lora_fix


def shrink_rows(op):
    x = torch.ones(3, 4)
    weights = torch.zeros(2, 1, 2, 4)
    weights[1] = 1.0  # the last slot holds an adapter; slot 0 is empty
    out = torch.zeros(3, 2)
    op(x, weights, out, torch.tensor([-1, 1, 0]), 1.0)  # a base token, the adapter's, slot 0's
    return out


def test_base_model_tokens_get_no_adapter_from_the_last_slot():
    from vllm.lora.ops.torch_ops import lora_ops
    from vllm.lora.punica_wrapper import punica_cpu

    cpu_lora_fix.install()
    assert lora_ops.bgmv_shrink is punica_cpu.bgmv_shrink
    out = shrink_rows(lora_ops.bgmv_shrink)
    assert out[0].abs().sum() == 0  # unpatched, the -1 token reads slot 1: 4.0 per column
    assert out[1].tolist() == [4.0, 4.0] and out[2].abs().sum() == 0
    assert not cpu_lora_fix.install()  # idempotent


def test_the_unpatched_op_has_the_bug_this_fixes():
    """If vLLM fixes its op, this fails: then the patch can go."""
    unpatched = getattr(cpu_lora_fix, "_original", None)
    from vllm.lora.ops.torch_ops import lora_ops
    original = lora_ops.bgmv_shrink.__closure__[0].cell_contents if hasattr(lora_ops.bgmv_shrink, "__closure__") \
        and lora_ops.bgmv_shrink.__closure__ else lora_ops.bgmv_shrink
    assert unpatched is None and shrink_rows(original)[0].tolist() == [4.0, 4.0]
