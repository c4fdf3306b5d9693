"""Merged checkpoints: one adapter version folded into the base model's weights (peft's
`merge_and_unload`), built once, stored content-addressed next to the adapter, checked like an upload.

Address: <store>/<tenant>/merged/<adapter sha256>/<build key>/ where the build key is the sha256 of
the base model's fingerprint and the dtype: the same weights on the same base in the same dtype
are one checkpoint, built by whichever dedicated replica comes first and reused by every other
(and by every restart). The base's fingerprint is the sha256 over its config.json and each weight
file's name, size and safetensors header (every tensor's dtype, shape and offsets): cheap on a
100 GB model, and a re-exported base gets a new one.

A checkpoint is config.json, the weights (safetensors only), the base's tokenizer, chat template
and generation config (vLLM serves the directory as a model of its own) and MANIFEST, the sha256
of each file, written last and removed first: a checkpoint exists only while its MANIFEST does,
and a copy is checked against it before a replica serves it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import tempfile
import uuid
from pathlib import Path

from loraplex.errors import StatusError
from loraplex.registry.store import CHUNK, AdapterStore, check_name
from loraplex.registry.validator import read_header

logger = logging.getLogger(__name__)

MANIFEST = "MANIFEST"
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".index.json")
# What must agree between the base and a merged checkpoint for it to be the same architecture.
ARCHITECTURE_KEYS = ("architectures", "model_type", "hidden_size", "num_hidden_layers", "num_attention_heads",
                     "num_key_value_heads", "intermediate_size", "vocab_size", "tie_word_embeddings")


class MergedCheckpointInvalid(StatusError):
    status = 422


def base_fingerprint(model_dir: str | Path) -> str:
    """sha256 of config.json and each weight file's name, size and safetensors header."""
    model_dir = Path(model_dir)
    h = hashlib.sha256((model_dir / "config.json").read_bytes())
    for file in sorted(model_dir.glob("*.safetensors")):
        h.update(f"\n{file.name}\n{file.stat().st_size}\n".encode())
        h.update(json.dumps(read_header(file), sort_keys=True).encode())
    return h.hexdigest()


def build_key(fingerprint: str, dtype: str) -> str:
    """The checkpoint's address under its adapter: the base it is merged into, in this dtype."""
    return hashlib.sha256(f"merged-v1\n{fingerprint}\n{dtype}".encode()).hexdigest()


def merge_dtype(setting: str, engine_dtype: str, base_dir: str | Path) -> str:
    """The dtype to merge and save in: the setting, else the engine's, else the base's own."""
    if setting != "auto":
        return setting
    if engine_dtype not in ("auto", ""):
        return {"float": "float32", "half": "float16", "bf16": "bfloat16"}.get(engine_dtype, engine_dtype)
    config = json.loads((Path(base_dir) / "config.json").read_text())
    return str(config.get("dtype") or config.get("torch_dtype") or "float32")


def tensor_shapes(model_dir: Path) -> dict[str, list[int]]:
    shapes = {}
    for file in sorted(model_dir.glob("*.safetensors")):
        shapes.update({k: v["shape"] for k, v in read_header(file).items() if k != "__metadata__"})
    return shapes


def check_same_architecture(merged_dir: Path, base_dir: Path) -> None:
    """Refuse a merged checkpoint that is not the base's architecture: config and every tensor's name
    and shape (what vLLM loads) must be the base's; only the values differ."""
    from transformers import AutoConfig

    try:
        merged, base = (AutoConfig.from_pretrained(str(d)).to_dict() for d in (merged_dir, base_dir))
    except Exception as exc:
        raise MergedCheckpointInvalid(f"the merged checkpoint does not load ({type(exc).__name__}: {exc})") from exc
    differ = [k for k in ARCHITECTURE_KEYS if merged.get(k) != base.get(k)]
    if differ:
        raise MergedCheckpointInvalid(f"the merged checkpoint's {', '.join(differ)} differ from the base model's: "
                                      "rebuild it (delete the merged directory) against the served model")
    got, want = tensor_shapes(merged_dir), tensor_shapes(base_dir)
    if got != want:
        extra, missing = sorted(set(got) - set(want))[:3], sorted(set(want) - set(got))[:3]
        reshaped = sorted(k for k in set(got) & set(want) if got[k] != want[k])[:3]
        raise MergedCheckpointInvalid(f"the merged checkpoint's tensors are not the base model's (extra {extra}, "
                                      f"missing {missing}, other shape {reshaped}): the adapter must leave no "
                                      "LoRA modules behind once merged")


def merge_into(base_dir: Path, adapter_dir: Path, out_dir: Path, dtype: str) -> None:
    """PeftModel.from_pretrained(base, adapter).merge_and_unload(), saved as safetensors, with the
    base's tokenizer files beside it. Loads the model in this process: a few GB for a 1B model."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=getattr(torch, dtype))
    merged = PeftModel.from_pretrained(base, str(adapter_dir)).merge_and_unload()
    merged.save_pretrained(str(out_dir), safe_serialization=True)
    for file in base_dir.iterdir():
        if file.is_file() and file.name != "config.json" and not file.name.endswith(WEIGHT_SUFFIXES):
            shutil.copyfile(file, out_dir / file.name)


def manifest_of(directory: Path) -> dict[str, str]:
    out = {}
    for file in sorted(p for p in directory.iterdir() if p.is_file() and p.name != MANIFEST):
        h = hashlib.sha256()
        with open(file, "rb") as f:
            while chunk := f.read(CHUNK):
                h.update(chunk)
        out[file.name] = h.hexdigest()
    return out


def delete_merged(store: AdapterStore, tenant: str, adapter_sha256: str) -> None:
    """Remove every merged checkpoint of this adapter, on any base (idempotent), MANIFESTs first."""
    check_name(tenant, "tenant id")
    fs, root = store.fs, f"{store.base}/{tenant}/merged/{adapter_sha256}"
    fs.invalidate_cache()
    if not fs.exists(root):
        return
    for manifest in fs.glob(f"{root}/*/{MANIFEST}"):
        fs.rm_file(manifest)
    fs.rm(root, recursive=True)


class MergedCheckpoints:
    """Merged checkpoints of `base_dir` in `dtype`, kept in the adapter store beside the adapters
    and copied into the node's adapter cache for vLLM."""

    def __init__(self, store: AdapterStore, base_dir: str | Path, dtype: str):
        self.store = store
        self.base_dir = Path(base_dir)
        self.dtype = dtype
        self.key = build_key(base_fingerprint(self.base_dir), dtype)

    def address(self, tenant: str, adapter_sha256: str) -> str:
        """Where the checkpoint of this adapter lives in the store (relative to the store's root)."""
        check_name(tenant, "tenant id")
        return f"{tenant}/merged/{adapter_sha256}/{self.key}"

    def exists(self, tenant: str, adapter_sha256: str) -> bool:
        self.store.fs.invalidate_cache()
        return self.store.fs.exists(f"{self.store.base}/{self.address(tenant, adapter_sha256)}/{MANIFEST}")

    def local_dir(self, tenant: str, adapter_sha256: str) -> Path:
        """A local directory holding the merged checkpoint, for vLLM: copied from the store if it is
        there, else built from the adapter (and stored for every other replica) first."""
        final = Path(self.store.cache_dir) / self.address(tenant, adapter_sha256)
        if (final / MANIFEST).exists():
            return final
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.parent / f".{uuid.uuid4().hex}"
        tmp.mkdir()
        try:
            if self.exists(tenant, adapter_sha256):
                self._download(tenant, adapter_sha256, tmp)
            else:
                self._build(tenant, adapter_sha256, tmp)
            try:
                tmp.rename(final)
            except OSError:
                if not (final / MANIFEST).exists():  # another replica on this node won the race
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return final

    def _build(self, tenant: str, adapter_sha256: str, out: Path) -> None:
        logger.info("building the merged checkpoint of %s/%s in %s", tenant, adapter_sha256, self.dtype)
        adapter_dir = self.store.fetch_to_local_cache(tenant, adapter_sha256)
        with tempfile.TemporaryDirectory(prefix="loraplex-merge-") as work:
            merge_into(self.base_dir, adapter_dir, Path(work), self.dtype)
            check_same_architecture(Path(work), self.base_dir)
            for file in Path(work).iterdir():
                shutil.move(str(file), out / file.name)
        manifest = json.dumps(manifest_of(out), indent=1, sort_keys=True)
        target = f"{self.store.base}/{self.address(tenant, adapter_sha256)}"
        self.store.fs.makedirs(target, exist_ok=True)
        for file in sorted(out.iterdir()):
            self.store.fs.put_file(str(file), f"{target}/{file.name}")
        self.store.fs.pipe_file(f"{target}/{MANIFEST}", manifest.encode())  # last: now it exists
        (out / MANIFEST).write_text(manifest)

    def _download(self, tenant: str, adapter_sha256: str, out: Path) -> None:
        source = f"{self.store.base}/{self.address(tenant, adapter_sha256)}"
        manifest = json.loads(self.store.fs.cat_file(f"{source}/{MANIFEST}"))
        for name in manifest:
            self.store.fs.get_file(f"{source}/{name}", str(out / name))
        if manifest_of(out) != manifest:
            raise RuntimeError(f"the merged checkpoint at {source} does not match its MANIFEST (corrupt or "
                               "half-written): delete that directory and the next replica rebuilds it")
        check_same_architecture(out, self.base_dir)
        (out / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))
