"""AdapterValidator accepts a servable LoRA and refuses everything else with 422 and a fix."""

from __future__ import annotations

import json

import numpy as np
import pytest
from registry_builders import lora_config, lora_tensors, write_adapter

from loraplex.registry.model_spec import BaseModelSpec
from loraplex.errors import StatusError
from loraplex.registry.validator import AdapterValidator, InvalidAdapter

ALL_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def test_spec_reads_served_model_dims(spec):
    assert spec.linear_shapes()["q_proj"] == (576, 576)
    assert spec.linear_shapes()["k_proj"] == (576, 192)  # 3 kv heads * 64
    assert spec.linear_shapes()["down_proj"] == (1536, 576)
    assert spec.num_layers == 30


def test_spec_from_real_model_dir(real_model_dir):
    real = BaseModelSpec.from_pretrained_dir(real_model_dir)
    assert real.hidden_size == 576 and real.num_kv_heads == 3 and real.head_dim == 64


def test_unknown_architecture_fails_at_startup():
    with pytest.raises(ValueError, match="model_type"):
        BaseModelSpec.from_config({"model_type": "gpt2"}, "gpt2")


def test_good_adapter_is_accepted(validator, good_adapter):
    adapter = validator.validate(good_adapter)
    assert adapter.rank == 8
    assert adapter.target_modules == ["q_proj", "v_proj"]
    assert adapter.base_model == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert adapter.size_bytes > 0


def test_all_linear_adapter_is_accepted(validator, spec, tmp_path):
    path = write_adapter(tmp_path / "a", lora_config(16, "all-linear"),
                         lora_tensors(spec, 16, ALL_LINEAR))
    assert validator.validate(path).target_modules == sorted(ALL_LINEAR)


def test_base_model_name_is_not_trusted(validator, spec, tmp_path):
    """Another name in the config is fine if the shapes fit: the tensors are the truth."""
    path = write_adapter(tmp_path / "a", lora_config(base_model_name_or_path="someone/else"),
                         lora_tensors(spec))
    assert validator.validate(path).base_model == "someone/else"


def test_real_peft_output_is_accepted(tmp_path):
    """What peft's save_pretrained writes (names, extra README) passes, on a tiny random Llama."""
    torch = pytest.importorskip("torch")
    peft = pytest.importorskip("peft")
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, vocab_size=256)
    torch.manual_seed(0)
    model = peft.get_peft_model(LlamaForCausalLM(config), peft.LoraConfig(
        r=4, target_modules=["q_proj", "v_proj", "down_proj"], task_type="CAUSAL_LM"))
    spec = BaseModelSpec.from_config(config.to_dict(), "tiny-llama")
    validator = AdapterValidator(spec, max_lora_rank=8)
    # As peft made it, lora_B is zeros: the adapter would answer exactly as the base model.
    model.save_pretrained(tmp_path / "untrained", safe_serialization=True)
    with pytest.raises(InvalidAdapter, match="all zeros.*untrained"):
        validator.validate(tmp_path / "untrained")
    with torch.no_grad():  # one "training step": lora_B moves off zero (in bf16 too)
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.01)
    model.to(torch.bfloat16).save_pretrained(tmp_path / "peft", safe_serialization=True)
    adapter = validator.validate(tmp_path / "peft")
    assert adapter.rank == 4 and adapter.target_modules == ["down_proj", "q_proj", "v_proj"]


def test_one_trained_module_is_enough(validator, spec, tmp_path):
    """The zero check refuses only an adapter that cannot change the output at all."""
    t = lora_tensors(spec, b_fill=0.0)
    t["base_model.model.model.layers.29.self_attn.v_proj.lora_B.weight"][5, 3] = 1e-3
    assert validator.validate(write_adapter(tmp_path / "a", lora_config(), t)).rank == 8


def bad_case(spec, case):
    """(config, tensors, extra files) of one broken adapter."""
    t = lora_tensors(spec)
    cfg = lora_config()
    extra = {}
    if case == "missing-config":
        cfg = None
    elif case == "config-not-json":
        cfg = "{peft_type: LORA"
    elif case == "config-not-object":
        cfg = "[1, 2]"
    elif case == "not-lora":
        cfg = lora_config(peft_type="IA3")
    elif case == "rank-not-int":
        cfg = lora_config(r="8")
    elif case == "rank-too-high":
        cfg, t = lora_config(128), lora_tensors(spec, 128)
    elif case == "rank-pattern-hides-tensor-rank":  # the config claims 8 everywhere, q_proj is 128
        cfg = lora_config(rank_pattern={"q_proj": 8})
        t = {**t, **lora_tensors(spec, 128, modules=("q_proj",))}
    elif case == "untrained-zero-b":
        t = lora_tensors(spec, b_fill=0.0)
    elif case == "negative-zero-b-f16":
        t = {k: v.astype(np.float16) for k, v in lora_tensors(spec, b_fill=-0.0).items()}
    elif case == "zero-a":
        t = lora_tensors(spec, fill=0.0, b_fill=0.5)
    elif case == "rank-pattern-not-int":
        cfg = lora_config(rank_pattern={"q_proj": "big"})
    elif case == "rank-pattern-too-high":
        cfg = lora_config(rank_pattern={"q_proj": 256})
    elif case == "unknown-target":
        cfg = lora_config(modules=("q_proj", "c_attn"))
    elif case == "embedding-target":
        cfg = lora_config(modules=("q_proj", "embed_tokens"))
    elif case == "lm-head-target":
        cfg = lora_config(modules=("q_proj", "lm_head"))
    elif case == "modules-to-save":
        cfg = lora_config(modules_to_save=["lm_head"])
    elif case == "dora":
        cfg = lora_config(use_dora=True)
    elif case == "bias":
        cfg = lora_config(bias="all")
    elif case == "bin-weights":
        extra = {"adapter_model.bin": b"\x80\x04pickle"}
        t = None
    elif case == "pt-beside-safetensors":
        extra = {"optimizer.pt": b"\x80\x04pickle"}
    elif case == "missing-weights":
        t = None
    elif case == "corrupt-safetensors":
        t = b"\x10\x00\x00\x00\x00\x00\x00\x00{not a header}"
    elif case == "truncated-safetensors":
        t = "truncate"
    elif case == "empty-safetensors":
        t = {}
    elif case == "wrong-tensor-names":
        t = {k.replace("base_model.model.model.layers", "transformer.h"): v for k, v in t.items()}
    elif case == "embedding-tensor":
        t["base_model.model.model.embed_tokens.lora_embedding_A"] = np.zeros((8, 49152), np.float32)
    elif case == "layer-out-of-range":
        t = lora_tensors(BaseModelSpec.from_config({**_cfg(spec), "num_hidden_layers": 32}, "x"))
    elif case == "module-under-wrong-parent":
        t = {k.replace("self_attn.q_proj", "mlp.q_proj"): v for k, v in t.items()}
    elif case == "missing-lora-b":
        t = {k: v for k, v in t.items() if not k.endswith("layers.3.self_attn.v_proj.lora_B.weight")}
    elif case == "other-base-model":  # Llama-3.2-1B dims
        other = {**_cfg(spec), "hidden_size": 2048, "intermediate_size": 8192, "num_attention_heads": 32,
                 "num_key_value_heads": 8, "head_dim": 64, "num_hidden_layers": 16}
        t = lora_tensors(BaseModelSpec.from_config(other, "llama-1b"))
    elif case == "rank-mismatch":
        t = lora_tensors(spec, r=4)
    elif case == "transposed":
        t = {k: np.ascontiguousarray(v.T) for k, v in t.items()}
    elif case == "int-dtype":
        t = {k: v.astype(np.int32) for k, v in t.items()}
    return cfg, t, extra


def _cfg(spec):
    return {"model_type": "llama", "hidden_size": spec.hidden_size,
            "intermediate_size": spec.intermediate_size, "num_hidden_layers": spec.num_layers,
            "num_attention_heads": spec.num_heads, "num_key_value_heads": spec.num_kv_heads,
            "head_dim": spec.head_dim, "vocab_size": spec.vocab_size}


BAD = {
    "missing-config": "no adapter_config.json",
    "config-not-json": "not valid JSON",
    "config-not-object": "must be a JSON object",
    "not-lora": "only LORA",
    "rank-not-int": "positive integer",
    "rank-too-high": "above this server's max_lora_rank 64",
    "rank-pattern-not-int": "positive integer ranks",
    "rank-pattern-too-high": "rank 256 is above",
    "rank-pattern-hides-tensor-rank": r"layers.0.q_proj has rank 128 .*above this server's max_lora_rank 64.*rank_pattern",
    "untrained-zero-b": "all zeros.*cannot change the base model's output",
    "negative-zero-b-f16": "all zeros",
    "zero-a": "all zeros",
    "unknown-target": r"\['c_attn'\].*does not have",
    "embedding-target": "embeddings / lm_head",
    "lm-head-target": "embeddings / lm_head",
    "modules-to-save": "modules_to_save",
    "dora": "DoRA",
    "bias": "bias",
    "bin-weights": "pickle weights are refused",
    "pt-beside-safetensors": "pickle weights are refused",
    "missing-weights": "no adapter_model.safetensors",
    "corrupt-safetensors": "not a readable safetensors",
    "truncated-safetensors": "not a readable safetensors",
    "empty-safetensors": "no tensors",
    "wrong-tensor-names": "is not a LoRA weight of",
    "embedding-tensor": "embeddings / lm_head",
    "layer-out-of-range": "30 layers",
    "module-under-wrong-parent": "under self_attn",
    "missing-lora-b": "no lora_B",
    "other-base-model": "trained for another base model",
    "rank-mismatch": "trained for another base model or rank",
    "transposed": "needs lora_A",
    "int-dtype": "dtype I32",
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_adapter_is_refused(validator, spec, tmp_path, case):
    cfg, tensors, extra = bad_case(spec, case)
    truncate = tensors == "truncate"
    path = write_adapter(tmp_path / case, cfg, lora_tensors(spec) if truncate else tensors)
    if truncate:
        weights = path / "adapter_model.safetensors"
        weights.write_bytes(weights.read_bytes()[:-100])
    for name, data in extra.items():
        (path / name).write_bytes(data)
    with pytest.raises(InvalidAdapter, match=BAD[case]) as e:
        validator.validate(path)
    assert e.value.status == 422
    assert ";" in e.value.message or "—" in e.value.message  # problem; then the fix


def test_max_rank_is_configurable(spec, tmp_path):
    path = write_adapter(tmp_path / "a", lora_config(32), lora_tensors(spec, 32))
    assert AdapterValidator(spec, max_lora_rank=32).validate(path).rank == 32
    with pytest.raises(InvalidAdapter, match="max_lora_rank 16"):
        AdapterValidator(spec, max_lora_rank=16).validate(path)


def test_config_is_read_as_json_only(validator, tmp_path, spec):
    path = write_adapter(tmp_path / "a", lora_config(), lora_tensors(spec))
    raw = json.loads((path / "adapter_config.json").read_text())
    assert validator.validate(path).config == raw


# --- keys PEFT acts on at load or merge (issue 34) --------------------------------------------

@pytest.mark.parametrize("key, value", [
    ("init_lora_weights", "pissa"), ("init_lora_weights", "pissa_niter_4"), ("init_lora_weights", "loftq"),
    ("init_lora_weights", "olora"), ("init_lora_weights", "eva"), ("init_lora_weights", "corda"),
    ("megatron_config", {"tensor_model_parallel_size": 2}), ("megatron_core", "os"),
    ("loftq_config", {"loftq_bits": 4}), ("eva_config", {"rho": 2.0}), ("corda_config", {"corda_method": "kpm"}),
    ("layer_replication", [[0, 4], [2, 8]]), ("use_qalora", True), ("lora_bias", True),
    ("trainable_token_indices", [1, 2]), ("target_parameters", ["mlp.experts.gate_up_proj"]),
    ("alora_invocation_tokens", [5]),
])
def test_keys_peft_would_act_on_are_refused_naming_the_key(validator, spec, tmp_path, key, value):
    src = write_adapter(tmp_path / "a", lora_config(**{key: value}), lora_tensors(spec))
    with pytest.raises(StatusError) as e:
        validator.validate(src)
    assert e.value.status == 422 and key in str(e.value)


@pytest.mark.parametrize("key, value", [
    ("init_lora_weights", True), ("init_lora_weights", False), ("init_lora_weights", "gaussian"),
    ("megatron_config", None), ("megatron_core", "megatron.core"), ("loftq_config", {}),
    ("layer_replication", None), ("use_qalora", False), ("lora_bias", False),
])
def test_peft_defaults_of_those_keys_are_accepted(validator, spec, tmp_path, key, value):
    validator.validate(write_adapter(tmp_path / "a", lora_config(**{key: value}), lora_tensors(spec)))


def test_auto_mapping_and_runtime_config_are_stripped(validator, spec, tmp_path):
    config = lora_config(auto_mapping={"base_model_class": "Evil", "parent_library": "evil.module"},
                         runtime_config={"ephemeral_gpu_offload": True})
    adapter = validator.validate(write_adapter(tmp_path / "a", config, lora_tensors(spec)))
    assert "auto_mapping" not in adapter.config and "runtime_config" not in adapter.config
