"""Decide whether an extracted PEFT dir is a LoRA adapter the served base model can run.

Everything is checked against the base model actually served (its config.json), never against
what the adapter claims: `base_model_name_or_path` is a free-text hint, the tensor names and
shapes are the truth. Weights are read with safetensors only; pickle formats run code on load.
An adapter that cannot change the output (every module's lora_B, or its lora_A, all zeros: what
peft writes before training) is refused too: it would be billed as an adapter and answer as
the base model (vLLM #34186 is the same silence for mismatched modules).
"""

from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from safetensors import SafetensorError, safe_open

from loraplex.errors import StatusError
from loraplex.registry.model_spec import BaseModelSpec
from loraplex.registry.peft_keys import check_peft_keys

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
PICKLE_SUFFIXES = {".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt"}
# vLLM serves LoRA on the linear layers only (no extra vocab): these need a full-vocab copy.
EMBEDDING_MODULES = {"embed_tokens", "lm_head", "wte", "embed_in", "embed_out"}
FLOAT_DTYPES = {"F16", "BF16", "F32"}
TENSOR_NAME = re.compile(
    r"base_model\.model\.model\.layers\.(\d+)\.(self_attn|mlp)\.(\w+)\.lora_(A|B)\.weight"
)
RETRAIN = "retrain it with peft's LoraConfig on the served base model"
_MAGNITUDE = {"F16": np.dtype("<u2"), "BF16": np.dtype("<u2"), "F32": np.dtype("<u4")}  # bits w/o sign
_CHUNK = 1 << 20


def is_all_zero(path: Path, header: dict, name: str) -> bool:
    """Whether tensor `name` holds only zeros (of either sign), read from the file's bytes: any
    float dtype (numpy has no bfloat16), one MiB at a time."""
    with open(path, "rb") as f:
        header_len = struct.unpack("<Q", f.read(8))[0]
        meta = header[name]
        start, end = meta["data_offsets"]
        f.seek(8 + header_len + start)
        bits = _MAGNITUDE[meta["dtype"]]
        sign_off = np.array((1 << (8 * bits.itemsize - 1)) - 1, dtype=bits)
        left = end - start
        while left > 0:
            chunk = f.read(min(_CHUNK, left))
            if not chunk:
                break
            left -= len(chunk)
            if (np.frombuffer(chunk, dtype=bits) & sign_off).any():
                return False
        return True


def read_header(path: Path) -> dict:
    """A safetensors file's header: tensor name -> {dtype, shape, data_offsets} (and __metadata__)."""
    with open(path, "rb") as f:
        return json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))


class InvalidAdapter(StatusError):
    """The archive unpacked fine but is not a LoRA adapter this base model can serve (422)."""

    status = 422


@dataclass(frozen=True)
class ValidatedAdapter:
    path: Path  # the PEFT dir
    config: dict
    rank: int
    target_modules: list[str]  # from the tensors, sorted
    base_model: str | None  # what the adapter says it was trained on; informational only
    size_bytes: int  # config + weights


@dataclass
class AdapterValidator:
    base: BaseModelSpec
    max_lora_rank: int  # EngineConfig.max_lora_rank: what the engine is started with

    def validate(self, peft_dir: Path) -> ValidatedAdapter:
        """Return the adapter's facts or raise InvalidAdapter (422) naming the problem and the fix."""
        self._check_files(peft_dir)
        config = check_peft_keys(self._read_config(peft_dir / CONFIG_FILE))
        rank = self._check_config(config)
        modules = self._check_weights(peft_dir / WEIGHTS_FILE, config, rank)
        return ValidatedAdapter(
            path=peft_dir,
            config=config,
            rank=rank,
            target_modules=sorted(modules),
            base_model=config.get("base_model_name_or_path"),
            size_bytes=sum((peft_dir / f).stat().st_size for f in (CONFIG_FILE, WEIGHTS_FILE)),
        )

    def _check_files(self, peft_dir: Path) -> None:
        pickles = [p.name for p in peft_dir.rglob("*") if p.suffix.lower() in PICKLE_SUFFIXES]
        if pickles:
            raise InvalidAdapter(f"{', '.join(sorted(pickles))}: pickle weights are refused because "
                                 "loading them runs code; save with "
                                 "model.save_pretrained(dir, safe_serialization=True) and upload "
                                 f"{WEIGHTS_FILE}")
        if not (peft_dir / CONFIG_FILE).is_file():
            raise InvalidAdapter(f"no {CONFIG_FILE} at the archive root or in its single top-level "
                                 "folder; upload the directory written by peft's save_pretrained")
        if not (peft_dir / WEIGHTS_FILE).is_file():
            raise InvalidAdapter(f"no {WEIGHTS_FILE} next to {CONFIG_FILE}; save the adapter "
                                 "with save_pretrained(dir, safe_serialization=True)")

    @staticmethod
    def _read_config(path: Path) -> dict:
        try:
            config = json.loads(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise InvalidAdapter(f"{CONFIG_FILE} is not valid JSON ({e}); upload the file "
                                 "peft's save_pretrained wrote") from e
        if not isinstance(config, dict):
            raise InvalidAdapter(f"{CONFIG_FILE} must be a JSON object; upload the file "
                                 "peft's save_pretrained wrote")
        return config

    def _check_config(self, config: dict) -> int:
        peft_type = config.get("peft_type")
        if str(peft_type).upper() != "LORA":
            raise InvalidAdapter(f"peft_type is {peft_type!r}, only LORA adapters can be served; "
                                 "train with peft's LoraConfig")
        rank = config.get("r")
        if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
            raise InvalidAdapter(f"r (the LoRA rank) is {rank!r}; it must be a positive integer")
        ranks = [rank, *(config.get("rank_pattern") or {}).values()]
        if not all(isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in ranks):
            raise InvalidAdapter(f"rank_pattern {config.get('rank_pattern')!r} must map module "
                                 "names to positive integer ranks; save the adapter with peft's LoraConfig")
        if max(ranks) > self.max_lora_rank:
            raise InvalidAdapter(f"LoRA rank {max(ranks)} is above this server's max_lora_rank "
                                 f"{self.max_lora_rank}; retrain with r <= {self.max_lora_rank}")
        if config.get("modules_to_save"):
            raise InvalidAdapter(f"modules_to_save={config['modules_to_save']!r} asks to replace "
                                 "whole base-model modules, which the engine cannot serve per "
                                 "request; retrain without modules_to_save")
        if config.get("use_dora"):
            raise InvalidAdapter("DoRA adapters (use_dora=true) are not supported by the engine; "
                                 "retrain with use_dora=false")
        if config.get("bias", "none") != "none":
            raise InvalidAdapter(f"bias={config['bias']!r} trains base-model biases, which the "
                                 "engine cannot serve per request; retrain with bias='none'")
        targets = config.get("target_modules")
        if isinstance(targets, list):
            self._check_module_names({str(t).split(".")[-1] for t in targets}, "target_modules")
        # A string is a regex or "all-linear"; the tensor names below say what it matched.
        return rank

    def _check_module_names(self, modules: set[str], where: str) -> None:
        embeddings = modules & EMBEDDING_MODULES
        if embeddings:
            raise InvalidAdapter(f"{where} includes {sorted(embeddings)}: LoRA on embeddings / "
                                 "lm_head (extra vocab) is not served; retrain targeting only "
                                 f"{', '.join(self.base.linear_shapes())}")
        unknown = modules - set(self.base.linear_shapes())
        if unknown:
            raise InvalidAdapter(f"{where} includes {sorted(unknown)}, which {self.base.model_id} "
                                 f"does not have; target some of "
                                 f"{', '.join(self.base.linear_shapes())}")

    def _check_weights(self, path: Path, config: dict, rank: int) -> set[str]:
        try:
            # Only headers are read (names, shapes, dtypes); "numpy" keeps torch out of ingress.
            with safe_open(str(path), framework="numpy") as f:
                shapes = {k: (f.get_slice(k).get_shape(), f.get_slice(k).get_dtype()) for k in f.keys()}
        except (SafetensorError, OSError, ValueError) as e:
            raise InvalidAdapter(f"{WEIGHTS_FILE} is not a readable safetensors file ({e}); "
                                 "save the adapter again with save_pretrained") from e
        if not shapes:
            raise InvalidAdapter(f"{WEIGHTS_FILE} has no tensors; save the trained adapter again")
        pairs: dict[tuple[int, str], dict[str, list[int]]] = {}
        names: dict[tuple[int, str], dict[str, str]] = {}
        for name, (shape, dtype) in shapes.items():
            layer, module, ab = self._parse_name(name)
            if dtype not in FLOAT_DTYPES:
                raise InvalidAdapter(f"tensor {name} has dtype {dtype}; LoRA weights must be "
                                     "F16, BF16 or F32")
            pairs.setdefault((layer, module), {})[ab] = list(shape)
            names.setdefault((layer, module), {})[ab] = name
        rank_pattern = bool(config.get("rank_pattern"))
        for (layer, module), ab in sorted(pairs.items()):
            self._check_pair(layer, module, ab, rank, rank_pattern)
        self._check_changes_output(path, [names[k] for k in sorted(names)])
        return {module for _, module in pairs}

    @staticmethod
    def _check_changes_output(path: Path, pairs: list[dict[str, str]]) -> None:
        # A module's update is lora_B @ lora_A: zero if either is. B first: peft starts it at
        # zero, and a trained adapter answers on its first pair, so two tensors are read.
        header = read_header(path)
        if any(not is_all_zero(path, header, ab["B"]) and not is_all_zero(path, header, ab["A"]) for ab in pairs):
            return
        raise InvalidAdapter(f"every lora_B (or its lora_A) tensor in {WEIGHTS_FILE} is all zeros, so "
                             "the adapter cannot change the base model's output: it looks untrained "
                             "(peft initialises lora_B to zeros); train it before uploading "
                             "(e.g. scripts/train_adapter.py), or call the base model")

    def _parse_name(self, name: str) -> tuple[int, str, str]:
        m = TENSOR_NAME.fullmatch(name)
        if m is None:
            if any(e in name for e in EMBEDDING_MODULES) or "lora_embedding" in name:
                self._check_module_names({"lm_head" if "lm_head" in name else "embed_tokens"},
                                         f"tensor {name}")
            raise InvalidAdapter(f"tensor {name} is not a LoRA weight of {self.base.model_id} "
                                 "(expected base_model.model.model.layers.<i>.<self_attn|mlp>."
                                 f"<module>.lora_<A|B>.weight); {RETRAIN}")
        layer, parent, module, ab = int(m[1]), m[2], m[3], m[4]
        self._check_module_names({module}, f"tensor {name}")
        if parent != self.base.parent_of(module) or layer >= self.base.num_layers:
            raise InvalidAdapter(f"tensor {name} names a module {self.base.model_id} does not have "
                                 f"(it has {self.base.num_layers} layers, {module} under "
                                 f"{self.base.parent_of(module)}); the adapter was made for "
                                 f"another base model — {RETRAIN}")
        return layer, module, ab

    def _check_pair(self, layer: int, module: str, ab: dict[str, list[int]], rank: int,
                    rank_pattern: bool) -> None:
        where = f"layers.{layer}.{module}"
        if set(ab) != {"A", "B"}:
            missing = "lora_B" if "A" in ab else "lora_A"
            raise InvalidAdapter(f"{where} has no {missing} weight; upload the complete "
                                 "adapter_model.safetensors from save_pretrained")
        in_f, out_f = self.base.linear_shapes()[module]
        r = ab["A"][0] if ab["A"] else -1
        if ab == {"A": [r, in_f], "B": [out_f, r]} and r > self.max_lora_rank:
            # The tensors are the truth, whatever r / rank_pattern claim.
            raise InvalidAdapter(f"{where} has rank {r} (lora_A {ab['A']}), above this server's "
                                 f"max_lora_rank {self.max_lora_rank}, though adapter_config.json claims "
                                 f"r={rank}{' with a rank_pattern' if rank_pattern else ''}; retrain with "
                                 f"every rank <= {self.max_lora_rank}")
        want_r = r if rank_pattern else rank  # rank_pattern: per-module ranks, bounded above
        expected = {"A": [want_r, in_f], "B": [out_f, want_r]}
        if ab != expected:
            raise InvalidAdapter(f"{where} has lora_A {ab['A']} and lora_B {ab['B']}, but "
                                 f"{self.base.model_id} with r={want_r} needs lora_A {expected['A']} "
                                 f"and lora_B {expected['B']}; the adapter was trained for another "
                                 f"base model or rank — {RETRAIN}")
