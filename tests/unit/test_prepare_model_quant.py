"""scripts/prepare_model.py's quantized builds (issue 35) write what vLLM reads back: the int4
nibbles unpack with vLLM's own helper (uint4b8, packed along the input dim) to within half a
step of the weights, the int8 rows to within half a step, and the configs name the schemes vLLM's
compressed-tensors loader picks on CPU. Random weights; no model, no engine."""

import importlib.util
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("prepare_model", ROOT / "scripts" / "prepare_model.py")
prepare_model = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(prepare_model)


def test_int4_groups_unpack_with_vllms_helper_to_within_half_a_step():
    quant_utils = pytest.importorskip("vllm.model_executor.layers.quantization.utils.quant_utils")
    from vllm.scalar_type import scalar_types

    torch.manual_seed(0)
    w = torch.randn(96, 128) * 0.05
    w[3, :32] = 0.0  # an all-zero group keeps a finite scale
    packed, scale = prepare_model.quantize_int4_groups(w, group_size=32)
    assert packed.dtype == torch.int32 and packed.shape == (96, 16)
    assert scale.shape == (96, 4) and torch.isfinite(scale).all()
    q = quant_utils.unpack_quantized_values_into_int32(packed, scalar_types.uint4b8, 1) - 8
    assert q.min() >= -8 and q.max() <= 7
    deq = (q.reshape(96, 4, 32).float() * scale.unsqueeze(-1)).reshape(96, 128)
    step = scale.repeat_interleave(32, dim=1)
    # Within half a step where the value is on the grid; a shrunk scale clips the largest ones.
    inside = w.abs() <= 7 * step
    assert ((deq - w).abs()[inside] <= step[inside] / 2 + 1e-7).all()
    assert ((deq - w).norm() / w.norm()) < 0.12


def test_int8_rows_to_within_half_a_step():
    torch.manual_seed(1)
    w = torch.randn(64, 96)
    q, scale = prepare_model.quantize_int8_per_channel(w)
    assert q.dtype == torch.int8 and scale.shape == (64, 1)
    assert ((q.float() * scale - w).abs() <= scale / 2 + 1e-6).all()


def test_configs_name_the_schemes_vllm_picks_on_cpu():
    w4 = prepare_model.w4a16_quantization_config()
    g = w4["config_groups"]["group_0"]
    assert w4["format"] == "pack-quantized" and g["input_activations"] is None
    assert g["weights"] == {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group",
                            "group_size": 32, "dynamic": False}
    w8 = prepare_model.w8a8_quantization_config()["config_groups"]["group_0"]
    assert w8["weights"]["strategy"] == "channel" and w8["input_activations"]["dynamic"] is True
    assert set(prepare_model.TARGETS) == {"smollm2", "w4a16", "w8a8"}


def test_gptq_moves_the_layer_outputs_less_than_rounding():
    quant_utils = pytest.importorskip("vllm.model_executor.layers.quantization.utils.quant_utils")
    from vllm.scalar_type import scalar_types

    torch.manual_seed(2)
    w = torch.randn(64, 128) * 0.05
    x = torch.randn(512, 128) @ torch.randn(128, 128) * 0.3  # correlated inputs
    h = (x.T @ x).double()

    def deq(packed, scale):
        q = quant_utils.unpack_quantized_values_into_int32(packed, scalar_types.uint4b8, 1) - 8
        return (q.reshape(64, 4, 32).float() * scale.unsqueeze(-1)).reshape(64, 128)

    rtn = deq(*prepare_model.quantize_int4_groups(w, group_size=32))
    gptq = deq(*prepare_model.gptq_int4_groups(w, h, group_size=32))
    assert (x @ (gptq - w).T).norm() < (x @ (rtn - w).T).norm()
