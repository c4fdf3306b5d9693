"""cpu_lora_ops: vLLM's CPU LoRA ops grouped by adapter give vLLM's results (the real vLLM ops,
compared on random batches), and a base-model token (index -1) gets no adapter, where vLLM's
own op gives it the last slot's."""

import pytest
import torch

from loraplex.engine import cpu_lora_ops


def vllm_op(name):
    cpu_lora_ops.install()
    return cpu_lora_ops.VLLM_OPS[name]


def shrink_rows(op):
    x = torch.ones(3, 4)
    weights = torch.zeros(2, 1, 2, 4)
    weights[1] = 1.0  # the last slot holds an adapter; slot 0 is empty
    out = torch.zeros(3, 2)
    op(x, weights, out, torch.tensor([-1, 1, 0]), 1.0)  # a base token, the adapter's, slot 0's
    return out


def test_install_puts_the_grouped_ops_where_vllm_looks_them_up():
    from vllm.lora.ops import torch_ops
    from vllm.lora.ops.torch_ops import lora_ops
    from vllm.lora.punica_wrapper import punica_cpu

    cpu_lora_ops.install()
    for name, op in cpu_lora_ops.GROUPED.items():
        assert getattr(lora_ops, name) is op and getattr(punica_cpu, name) is op and getattr(torch_ops, name) is op
    assert not cpu_lora_ops.install()  # idempotent


def test_base_model_tokens_get_no_adapter_from_the_last_slot():
    out = shrink_rows(cpu_lora_ops.bgmv_shrink)
    assert out[0].abs().sum() == 0  # vLLM's op: the -1 token reads slot 1, 4.0 per column
    assert out[1].tolist() == [4.0, 4.0] and out[2].abs().sum() == 0


def test_the_vllm_op_has_the_bug_this_fixes():
    """If vLLM fixes its op, this fails: then say so in cpu_lora_ops' docstring."""
    assert shrink_rows(vllm_op("bgmv_shrink"))[0].tolist() == [4.0, 4.0]


BATCHES = {  # slot per row: one adapter, several, with base-model rows, one row, none
    "one adapter": [2] * 7,
    "three adapters": [0, 2, 1, 2, 0, 0, 1],
    "with base rows": [1, -1, 3, -1, 1, 3, 3],
    "one row": [3],
    "all base": [-1, -1, -1],
}


@pytest.mark.parametrize("batch", list(BATCHES))
@pytest.mark.parametrize("stacked_dims", [3, 4])
def test_grouped_ops_match_vllms_on_every_row_with_an_adapter(batch, stacked_dims):
    torch.manual_seed(0)
    indices = torch.tensor(BATCHES[batch])
    n, hidden, rank, out_dim, slots = len(indices), 24, 4, 40, 4
    has_lora = indices >= 0

    def stacked(*shape):
        w = torch.randn(slots, *shape)
        return w.unsqueeze(1) if stacked_dims == 4 else w

    x, a, b = torch.randn(n, hidden), stacked(rank, hidden), stacked(out_dim, rank)
    # shrink: (n, rank) = x @ A^T per row, scaled
    mine, theirs = torch.zeros(n, rank), torch.zeros(n, rank)
    cpu_lora_ops.bgmv_shrink(x, a, mine, indices, 0.5)
    vllm_op("bgmv_shrink")(x, a, theirs, indices, 0.5)
    torch.testing.assert_close(mine[has_lora], theirs[has_lora])
    assert mine[~has_lora].abs().sum() == 0
    # expand (added to the output, and written over it) and expand into a slice of a wider output
    shrunk = mine
    base = torch.randn(n, out_dim + 8)
    for add in (True, False):
        mine_y, theirs_y = base.clone(), base.clone()
        cpu_lora_ops.bgmv_expand(shrunk, b, mine_y, indices, add)
        vllm_op("bgmv_expand")(shrunk, b, theirs_y, indices, add)
        torch.testing.assert_close(mine_y, theirs_y)  # shrunk is 0 on base rows: equal everywhere
        mine_y, theirs_y = base.clone(), base.clone()
        cpu_lora_ops.bgmv_expand_slice(shrunk, b, mine_y, indices, 8, out_dim, add)
        vllm_op("bgmv_expand_slice")(shrunk, b, theirs_y, indices, 8, out_dim, add)
        torch.testing.assert_close(mine_y, theirs_y)


def test_the_prefill_path_runs_the_grouped_ops():
    """sgmv_* (prefill) expand per-sequence indices and call the bgmv ops through their module."""
    from vllm.lora.ops.torch_ops import lora_ops
    cpu_lora_ops.install()
    x, a = torch.ones(5, 4), torch.zeros(2, 2, 4)
    a[1] = 1.0
    out = torch.zeros(5, 2)
    # two sequences: 2 base-model tokens, then 3 of slot 1's adapter
    lora_ops.sgmv_shrink(x, a, out, torch.tensor([0, 2]), torch.tensor([2, 3]), torch.tensor([-1, 1]), 2, 3, 5, 1.0)
    assert out[:2].abs().sum() == 0 and out[2:].tolist() == [[4.0, 4.0]] * 3


def test_a_batch_updated_in_place_is_grouped_anew():
    """vLLM rewrites its index tensor in place each step: the kept grouping must not outlive it."""
    indices = torch.tensor([0, 1, 0, 1])
    x, a = torch.ones(4, 2), torch.stack([torch.zeros(1, 2), torch.ones(1, 2)])
    out = torch.zeros(4, 1)
    cpu_lora_ops.bgmv_shrink(x, a, out, indices, 1.0)
    assert out.squeeze(1).tolist() == [0.0, 2.0, 0.0, 2.0]
    indices.copy_(torch.tensor([1, 0, 1, 0]))
    cpu_lora_ops.bgmv_shrink(x, a, out, indices, 1.0)
    assert out.squeeze(1).tolist() == [2.0, 0.0, 2.0, 0.0]


def test_the_ops_compute_in_the_engines_dtype_and_give_the_float32_result_within_bf16_rounding():
    """A bfloat16 engine stacks bf16 adapters: the product is bf16 arithmetic (no float32 copy of
    the slot's weights per call), stored into the op's output (the shrink's float32 buffer)."""
    torch.manual_seed(0)
    indices = torch.tensor([1, 1, -1, 0])
    x, a = torch.randn(4, 64), torch.randn(2, 8, 64)
    assert cpu_lora_ops.lora_product(x.bfloat16(), a.bfloat16(), indices).dtype == torch.bfloat16
    assert cpu_lora_ops.lora_product(x, a, indices).dtype == torch.float32
    exact, bf16 = torch.zeros(4, 8), torch.zeros(4, 8)
    cpu_lora_ops.bgmv_shrink(x, a, exact, indices, 0.5)
    cpu_lora_ops.bgmv_shrink(x.bfloat16(), a.bfloat16(), bf16, indices, 0.5)
    assert bf16.dtype == torch.float32
    torch.testing.assert_close(bf16, exact, rtol=0.05, atol=0.2)
    b, y_exact, y_bf16 = torch.randn(2, 16, 8), torch.zeros(4, 16), torch.zeros(4, 16, dtype=torch.bfloat16)
    cpu_lora_ops.bgmv_expand(exact, b, y_exact, indices, True)
    cpu_lora_ops.bgmv_expand(bf16, b.bfloat16(), y_bf16, indices, True)
    torch.testing.assert_close(y_bf16.float(), y_exact, rtol=0.05, atol=0.5)
