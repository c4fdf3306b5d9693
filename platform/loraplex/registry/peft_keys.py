"""The adapter_config.json keys PEFT acts on when it loads or merges an adapter (peft 0.21's
LoraConfig): refused unless inert, or stripped.

A merged dedicated replica (registry/merged_checkpoint.py) builds a PeftModel from the stored
config, and vLLM reads it too; a key there is code we run on the tenant's behalf. Each key is
decided once, here (docs/operations.md, security):
- refused (422 naming the key) when set to anything but its inert value: a non-default
  `init_lora_weights` (pissa, olora, loftq, eva, corda, lora_ga, orthogonal...: SVD or data-driven
  initialisation that rewrites the base weights at load), `megatron_config` / a `megatron_core`
  other than PEFT's default (a module to import), the initialisers' configs (`loftq_config`,
  `eva_config`, `corda_config`, `lora_ga_config`, ...), `layer_replication` (copies base layers),
  `use_qalora`, `lora_bias`, `trainable_token_indices` / `ensure_weight_tying` (embedding
  changes), `target_parameters`, `alora_invocation_tokens`, `use_bdlora`: none is what the
  engine serves, each changes the base model or what runs;
- stripped: `auto_mapping` (class names AutoPeftModel would import) and `runtime_config`
  (load-time settings), which describe how the trainer loaded it, not the weights.
`use_dora`, `modules_to_save` and `bias` are refused by the validator with their own messages.
"""

from __future__ import annotations

from typing import Any, Callable

from loraplex.errors import StatusError

INERT_INIT = (True, False, "gaussian")  # initialisers that only seed new weights; ours are trained
RETRAIN = "remove it from adapter_config.json (it only matters when training) or retrain with peft's defaults"


def _empty(v: Any) -> bool:
    return v is None or v == {} or v == [] or v is False


REFUSED: dict[str, tuple[Callable[[Any], bool], str]] = {
    "init_lora_weights": (lambda v: v in INERT_INIT or v is None,
                          "initialises the adapter from the base weights (SVD / data-driven: pissa, olora, loftq, "
                          "eva, corda...) and rewrites them when PEFT loads it"),
    "megatron_config": (_empty, "builds Megatron parallel layers when PEFT loads it"),
    "megatron_core": (lambda v: v in (None, "megatron.core"), "names a module PEFT imports"),
    "loftq_config": (_empty, "runs LoftQ quantisation of the base weights"),
    "eva_config": (_empty, "runs EVA initialisation on data"),
    "corda_config": (_empty, "runs CorDA decomposition of the base weights"),
    "lora_ga_config": (_empty, "runs LoRA-GA initialisation"),
    "velora_config": (_empty, "changes how the LoRA layers compute"),
    "monteclora_config": (_empty, "changes how the LoRA layers compute"),
    "arrow_config": (_empty, "routes between several adapters"),
    "kasa_config": (_empty, "changes how the LoRA layers compute"),
    "layer_replication": (_empty, "replicates base-model layers"),
    "use_qalora": (_empty, "is a quantisation-aware LoRA the engine does not serve"),
    "lora_bias": (_empty, "adds bias weights the engine does not serve"),
    "trainable_token_indices": (_empty, "trains embedding rows the engine does not serve"),
    "ensure_weight_tying": (_empty, "ties embedding weights the engine does not serve"),
    "target_parameters": (_empty, "puts LoRA on raw parameters, which the engine does not serve"),
    "alora_invocation_tokens": (_empty, "makes an activated LoRA the engine does not serve"),
    "use_bdlora": (_empty, "is a block-diagonal LoRA the engine does not serve"),
}
STRIPPED = ("auto_mapping", "runtime_config")


class ActedOnKey(StatusError):
    status = 422


def check_peft_keys(config: dict) -> dict:
    """`config` without the stripped keys; ActedOnKey (422) naming the first key PEFT would act on."""
    for key, (inert, why) in REFUSED.items():
        if key in config and not inert(config[key]):
            raise ActedOnKey(f"adapter_config.json sets {key}={config[key]!r}, which {why}; this server "
                             f"refuses it: {RETRAIN}")
    return {k: v for k, v in config.items() if k not in STRIPPED}
