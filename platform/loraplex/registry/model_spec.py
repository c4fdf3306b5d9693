"""The served base model's shape, as far as LoRA validation needs it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

# Decoder families whose linear layers carry the Llama names; vLLM serves LoRA on all of them.
LLAMA_LIKE = {"llama", "mistral", "qwen2", "qwen3", "granite"}
ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class BaseModelSpec:
    model_id: str  # what clients call it; also shown in error messages
    model_type: str
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int

    @classmethod
    def from_pretrained_dir(cls, path: str | Path, model_id: str | None = None) -> "BaseModelSpec":
        path = Path(path)
        config = json.loads((path / "config.json").read_text())
        return cls.from_config(config, model_id or path.name)

    @classmethod
    def from_config(cls, config: dict, model_id: str) -> "BaseModelSpec":
        model_type = config.get("model_type", "")
        if model_type not in LLAMA_LIKE:
            # A server setup problem, not an upload problem: fail at startup, loudly.
            raise ValueError(f"adapter validation knows the module layout of {sorted(LLAMA_LIKE)}, "
                             f"not model_type={model_type!r}; add it to BaseModelSpec")
        heads = config["num_attention_heads"]
        return cls(
            model_id=model_id,
            model_type=model_type,
            hidden_size=config["hidden_size"],
            intermediate_size=config["intermediate_size"],
            num_layers=config["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=config.get("num_key_value_heads") or heads,
            head_dim=config.get("head_dim") or config["hidden_size"] // heads,
            vocab_size=config["vocab_size"],
        )

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """(in_features, out_features) of every module a LoRA may target."""
        q_out = self.num_heads * self.head_dim
        kv_out = self.num_kv_heads * self.head_dim
        return {
            "q_proj": (self.hidden_size, q_out),
            "k_proj": (self.hidden_size, kv_out),
            "v_proj": (self.hidden_size, kv_out),
            "o_proj": (q_out, self.hidden_size),
            "gate_proj": (self.hidden_size, self.intermediate_size),
            "up_proj": (self.hidden_size, self.intermediate_size),
            "down_proj": (self.intermediate_size, self.hidden_size),
        }

    @staticmethod
    def parent_of(module: str) -> str:
        return "self_attn" if module in ATTENTION else "mlp"
