"""What a dedicated Engine replica serves: its adapter version merged into the base weights.

The replica is the Engine deployment's own class (engine/deployment.py), bound with the version's
DedicatedTarget: before vLLM starts, it builds the merged checkpoint or fetches the stored one
(registry/merged_checkpoint.py) and runs it as its base model, without LoRA; then it serves that
version's merged calls and refuses every other call, so no request can run on weights that are not
its own (and a merged call can never reach a LoRA replica, which would answer as the base model).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from loraplex.contract import EngineCall, EngineError
from loraplex.dedicated.targets import DedicatedTarget
from loraplex.registry.merged_checkpoint import MergedCheckpoints, merge_dtype
from loraplex.registry.store import AdapterStore

if TYPE_CHECKING:  # annotations only: the root config imports this package's config, never the reverse
    from loraplex.config import PlatformConfig


def local_model_dir(model: str) -> Path:
    """The base model as a local directory: itself, or its HF cache snapshot."""
    if Path(model).is_dir():
        return Path(model)
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(model))


def merged_engine_config(config: PlatformConfig, target: DedicatedTarget, store: AdapterStore) -> PlatformConfig:
    """The replica's config: the merged checkpoint (built or fetched now) as its model, served under
    the base model's name, no LoRA. Blocks (merging loads the model): call it in a thread."""
    engine = config.engine
    base_dir = local_model_dir(engine.model)
    dtype = merge_dtype(config.dedicated.merge_dtype, engine.dtype, base_dir)
    merged = MergedCheckpoints(store, base_dir, dtype).local_dir(target.tenant, target.sha256)
    return config.model_copy(update={"engine": engine.model_copy(update={
        "model": str(merged), "served_model_name": engine.model_id, "enable_lora": False})})


def path_refusal(target: DedicatedTarget | None, call: EngineCall) -> EngineError | None:
    """None if this replica may serve the call; else the 503 that says why (never billed)."""
    merged_call = call.path == "merged" and call.adapter is not None
    if target is None:
        if not merged_call:
            return None
        message = "This is a LoRA replica; the call was sent down the merged path by mistake. Retry it."
    elif target.serves(call):
        return None
    else:
        message = f"This dedicated replica serves only {target.label} merged; retry the request."
    return EngineError(status=503, message=message, type="service_unavailable", retry_after=1, reason="wrong_path")
