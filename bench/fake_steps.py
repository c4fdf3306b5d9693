"""vLLM's own Scheduler driven without a model: fake model outputs (one token per request that
finished its prompt, none for a prefill chunk) and a KV cache that is only bookkeeping. For unit
tests of the tenant scheduler's choices (tests/unit/engine/test_tenant_scheduler.py) and its
per-step cost at GPU batch sizes (python -m bench tenant_scheduler). Never an engine: nothing
here computes a token."""

from __future__ import annotations

import itertools

import torch
from vllm.config import CacheConfig, LoRAConfig, ModelConfig, SchedulerConfig, VllmConfig
from vllm.lora.request import LoRARequest
from vllm.sampling_params import SamplingParams
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

from loraplex.engine.tenant_scheduler import slo_args

BLOCK = 16


class FakeClock:
    """The `time` module for the tenant scheduler on fake steps: moves only by the fake steps' times."""

    def __init__(self):
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return self.now


def make_scheduler(cls, model_dir: str, additional_config: dict | None = None, max_num_seqs: int = 16,
                   token_budget: int = 2048, max_loras: int | None = None, blocks: int = 4096):
    """A scheduler of class `cls` (vLLM's Scheduler or a subclass) over a fake KV cache of `blocks`."""
    model = ModelConfig(model=model_dir, dtype="float32", max_model_len=4096, seed=0, skip_tokenizer_init=True)
    sched = SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=token_budget, max_model_len=4096,
                            enable_chunked_prefill=True, is_encoder_decoder=False)
    cache = CacheConfig(block_size=BLOCK, cache_dtype="auto", enable_prefix_caching=False)
    lora = LoRAConfig(max_loras=max_loras, max_lora_rank=8) if max_loras else None
    vllm_config = VllmConfig(model_config=model, scheduler_config=sched, cache_config=cache, lora_config=lora,
                             additional_config=additional_config or {})
    cache.num_gpu_blocks = blocks
    kv = KVCacheConfig(num_blocks=blocks, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(
        ["layer"], FullAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=8, dtype=torch.float32))])
    return cls(vllm_config=vllm_config, kv_cache_config=kv, block_size=BLOCK, log_stats=False,
               structured_output_manager=StructuredOutputManager(vllm_config))


_ids = itertools.count()


def fake_request(tenant: str, prompt: int, max_tokens: int = 8, arrival: float | None = None, priority: int = 0,
                 lora: int = 0, slo=None) -> Request:
    """A request of `prompt` tokens for `tenant` (its extra_args as VLLMEngine sets them; `slo`: its
    class's contract.SloTargets)."""
    i = next(_ids)
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True,
                            extra_args={"loraplex_tenant": tenant, **slo_args(slo)})
    return Request(request_id=f"{tenant}-{i}", prompt_token_ids=[7] * prompt, sampling_params=params,
                   pooling_params=None, arrival_time=float(i) if arrival is None else arrival, priority=priority,
                   lora_request=LoRARequest(f"adapter-{lora}", lora, "/nowhere") if lora else None)


def fake_step(s) -> dict[str, int]:
    """One step: schedule, then a fake model output (a token for each request past its prompt)."""
    out: SchedulerOutput = s.schedule()
    ids = list(out.num_scheduled_tokens)
    sampled = [[] if s.requests[r].num_computed_tokens < s.requests[r].num_tokens else [11] for r in ids]
    s.update_from_output(out, ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                                sampled_token_ids=sampled))
    return dict(out.num_scheduled_tokens)
