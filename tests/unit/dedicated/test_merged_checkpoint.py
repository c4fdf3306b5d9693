"""The merged checkpoint: its content address, built once with peft on a tiny Llama and reused,
checked like an upload (the base's architecture and tensors), removed with its adapter."""

import json
from pathlib import Path

import pytest

from loraplex.registry.config import RegistryConfig
from loraplex.registry import merged_checkpoint as mc
from loraplex.registry.store import AdapterStore
from loraplex.registry.validator import ValidatedAdapter


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[Path, Path]:
    """A tiny random Llama (the base) and a trained-looking LoRA on it (lora_B not zero)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    root = tmp_path_factory.mktemp("tiny")
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=1, vocab_size=64, tie_word_embeddings=True)
    LlamaForCausalLM(config).save_pretrained(root / "base")
    (root / "base" / "tokenizer.json").write_text("{}")  # copied beside the merged weights
    peft = get_peft_model(LlamaForCausalLM.from_pretrained(root / "base"),
                          LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    peft.save_pretrained(root / "adapter")
    return root / "base", root / "adapter"


def store_with(tmp_path: Path, adapter_dir: Path) -> tuple[AdapterStore, str]:
    store = AdapterStore(RegistryConfig(store_url=str(tmp_path / "store"), cache_dir=str(tmp_path / "cache")))
    config = json.loads((adapter_dir / "adapter_config.json").read_text())
    blob = store.put("ten_a", ValidatedAdapter(adapter_dir, config, 2, ["q_proj", "v_proj"], None, 0))
    return store, blob.sha256


def test_the_address_is_the_adapter_then_the_base_and_dtype(tiny, tmp_path):
    base, adapter = tiny
    store, sha = store_with(tmp_path, adapter)
    checkpoints = mc.MergedCheckpoints(store, base, "float32")
    fingerprint = mc.base_fingerprint(base)
    assert checkpoints.address("ten_a", sha) == f"ten_a/merged/{sha}/{mc.build_key(fingerprint, 'float32')}"
    assert mc.build_key(fingerprint, "float32") != mc.build_key(fingerprint, "bfloat16")
    other = tmp_path / "other-base"
    other.mkdir()
    (other / "config.json").write_text((base / "config.json").read_text().replace('"vocab_size": 64', '"vocab_size": 65'))
    (other / "model.safetensors").write_bytes((base / "model.safetensors").read_bytes())
    assert mc.base_fingerprint(other) != fingerprint  # another base: another checkpoint


def test_merge_dtype_is_the_setting_else_the_engine_s_else_the_base_s(tiny):
    base, _ = tiny
    assert mc.merge_dtype("bfloat16", "float32", base) == "bfloat16"
    assert mc.merge_dtype("auto", "float32", base) == "float32"
    assert mc.merge_dtype("auto", "auto", base) == "float32"  # the tiny base was saved in float32


def test_built_once_stored_with_a_manifest_reused_and_equal_to_peft_s_merge(tiny, tmp_path, monkeypatch):
    import torch
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import LlamaForCausalLM

    base, adapter = tiny
    store, sha = store_with(tmp_path, adapter)
    merges = []
    real_merge = mc.merge_into
    monkeypatch.setattr(mc, "merge_into", lambda *a: merges.append(a) or real_merge(*a))
    checkpoints = mc.MergedCheckpoints(store, base, "float32")
    local = checkpoints.local_dir("ten_a", sha)
    assert checkpoints.exists("ten_a", sha) and len(merges) == 1
    assert (local / "tokenizer.json").exists() and (local / mc.MANIFEST).exists()
    stored = tmp_path / "store" / checkpoints.address("ten_a", sha)
    assert json.loads((stored / mc.MANIFEST).read_text()) == mc.manifest_of(local)
    # The weights are W + BA: what peft's own merge gives.
    want = PeftModel.from_pretrained(LlamaForCausalLM.from_pretrained(base), adapter).merge_and_unload().state_dict()
    got = load_file(local / "model.safetensors")
    q = "model.layers.0.self_attn.q_proj.weight"
    assert torch.equal(got[q], want[q]) and not torch.equal(got[q], load_file(base / "model.safetensors")[q])
    # Another node (empty cache) fetches it; nothing is merged again.
    again = mc.MergedCheckpoints(AdapterStore(RegistryConfig(store_url=str(tmp_path / "store"),
                                                             cache_dir=str(tmp_path / "cache2"))), base, "float32")
    assert again.local_dir("ten_a", sha) != local and len(merges) == 1
    # Removed with its adapter.
    mc.delete_merged(store, "ten_a", sha)
    assert not checkpoints.exists("ten_a", sha) and not (tmp_path / "store" / "ten_a" / "merged" / sha).exists()


def test_a_corrupt_stored_checkpoint_is_refused(tiny, tmp_path):
    base, adapter = tiny
    store, sha = store_with(tmp_path, adapter)
    checkpoints = mc.MergedCheckpoints(store, base, "float32")
    checkpoints.local_dir("ten_a", sha)
    stored = tmp_path / "store" / checkpoints.address("ten_a", sha)
    (stored / "model.safetensors").write_bytes((stored / "model.safetensors").read_bytes()[:-8] + b"\0" * 8)
    fresh = mc.MergedCheckpoints(AdapterStore(RegistryConfig(store_url=str(tmp_path / "store"),
                                                             cache_dir=str(tmp_path / "cache3"))), base, "float32")
    with pytest.raises(RuntimeError, match="does not match its MANIFEST"):
        fresh.local_dir("ten_a", sha)


def test_a_checkpoint_of_another_architecture_is_refused(tiny, tmp_path):
    import shutil

    base, _ = tiny
    merged = tmp_path / "merged"
    shutil.copytree(base, merged)
    config = json.loads((merged / "config.json").read_text())
    (merged / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 3}))
    with pytest.raises(mc.MergedCheckpointInvalid, match="num_hidden_layers"):
        mc.check_same_architecture(merged, base)
    (merged / "config.json").write_text(json.dumps(config))
    mc.check_same_architecture(merged, base)  # the same: fine
    from safetensors.torch import load_file, save_file

    tensors = load_file(merged / "model.safetensors")
    tensors["model.layers.0.self_attn.q_proj.lora_A.weight"] = tensors["model.layers.0.self_attn.q_proj.weight"][:2].clone()
    save_file(tensors, merged / "model.safetensors")
    with pytest.raises(mc.MergedCheckpointInvalid, match="extra"):
        mc.check_same_architecture(merged, base)
