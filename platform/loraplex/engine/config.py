"""The Engine replicas' settings: vLLM (EngineConfig), the tenant scheduler in its step, and the
pool (EngineDeploymentConfig): resources, shedding, the fair queue and its dispatch limit."""

from __future__ import annotations

from bisect import bisect_right
from pathlib import Path
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from loraplex.routing.config import RoutingConfig


class AdaptiveLimitConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    initial: Optional[int] = Field(
        None, ge=1,
        description="The adaptive dispatch limit at start; None: max_num_seqs.")
    min_limit: int = Field(
        2, ge=1,
        description="The lowest the adaptive limit falls (at most max_num_seqs).")
    tpot_s: Optional[float] = Field(
        None, gt=0, description="Target time per output token, the one latency the limit follows; None: the "
        "`slo:` tpot_p95_s.")

    window: int = Field(20, ge=1, description="Finished requests per decision to raise or lower the limit.")
    window_s: Optional[float] = Field(
        10.0, gt=0, description="A decision is also taken this many seconds into a window once it holds a "
        "finished request per slot; None: by `window` alone.")
    slow_share: float = Field(
        0.05, ge=0, lt=1, description="Share of a window's requests over the target that lowers the limit (0.05: "
        "the 95th percentile).")
    backoff: float = Field(0.75, gt=0, lt=1, description="The limit is multiplied by this when lowered.")
    slow_start: bool = Field(
        True, description="Until the limit is first lowered, a window within the target with demand for more "
        "slots doubles it instead of adding 1 (TCP's slow start).")

    @model_validator(mode="before")
    @classmethod
    def _no_ttft_target(cls, data):
        if isinstance(data, dict) and "ttft_s" in data:
            raise ValueError(
                "fair_queue.adaptive.ttft_s is no longer read: the adaptive dispatch limit follows time per output "
                "token only (docs/operations.md); remove it, or set adaptive.tpot_s or slo.tpot_p95_s instead.")
        return data


class SheddingConfig(BaseModel):
    """When an Engine replica refuses new requests: by the tenant's priority, and only a tenant over
    its share of the replica (engine/shedding.py)."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(True, description="Refuse new work when the replica is overloaded.")
    shed_requests: int = Field(
        48, ge=0,
        description="Sequences in vLLM on a replica (running + waiting there) at which priority-0 requests of "
        "tenants over their share are refused (with the fair queue on, a value set at or above max_num_seqs is "
        "refused as never reached).",
    )
    max_requests: int = Field(
        128, ge=0, description="Sequences in vLLM at which every request is refused (priority 100); a priority in "
        "between is refused at its linear share of the way from shed_requests.",
    )
    requests_by_priority: Optional[dict[int, int]] = Field(
        None,
        description="Sequences in vLLM at which each listed priority is refused (e.g. {0: 1, 50: 2, 100: 8}, "
        "linear in between), in place of shed_requests / max_requests.",
    )
    shed_kv_usage: float = Field(
        0.95, gt=0, le=1, description="KV-cache usage (0..1) at which priority-0 requests are refused."
    )
    max_kv_usage: float = Field(1.0, gt=0, le=1, description="KV-cache usage at which every request is refused.")
    retry_after_s: int = Field(2, ge=1, description="Retry-After of a shed request, in seconds.")
    sample_period_s: float = Field(
        0.25, gt=0, description="How long the replica reuses one reading of vLLM's KV-usage gauge."
    )

    @field_validator("requests_by_priority")
    @classmethod
    def _ladder(cls, value: Optional[dict[int, int]]) -> Optional[dict[int, int]]:
        if value is None:
            return None
        if not value:
            raise ValueError("requests_by_priority needs at least one priority: count")
        if any(not 0 <= p <= 100 for p in value) or any(n < 0 for n in value.values()):
            raise ValueError("requests_by_priority: priorities are 0..100 and counts at least 0")
        counts = [value[p] for p in sorted(value)]
        if counts != sorted(counts):
            raise ValueError("requests_by_priority: a higher priority may not be refused at fewer requests "
                             f"in flight than a lower one (got {value})")
        return {p: value[p] for p in sorted(value)}  # in priority order: requests_limit bisects it

    def requests_limit(self, priority: int) -> float:
        """Requests in flight at which a request of this priority is refused."""
        p = min(max(priority, 0), 100)
        if self.requests_by_priority is None:
            return self.shed_requests + (self.max_requests - self.shed_requests) * p / 100
        ladder = self.requests_by_priority
        priorities = list(ladder)  # in order: the validator sorted them
        i = bisect_right(priorities, p)
        if i == 0 or i == len(priorities):
            return ladder[priorities[min(i, len(priorities) - 1)]]
        p0, p1 = priorities[i - 1], priorities[i]
        return ladder[p0] + (ladder[p1] - ladder[p0]) * (p - p0) / (p1 - p0)

    @model_validator(mode="after")
    def _ordered(self) -> "SheddingConfig":
        if self.max_requests < self.shed_requests or self.max_kv_usage < self.shed_kv_usage:
            raise ValueError("max_requests / max_kv_usage must be at least shed_requests / shed_kv_usage")
        return self


class FairQueueConfig(BaseModel):
    """The per-tenant fair queue of each Engine replica (VTC; docs/operations.md)."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(
        True, description="Queue per tenant and dispatch fairly; false: every request goes to vLLM at once.")
    dispatch_limit: Union[int, Literal["adaptive"], None] = Field(
        None,
        description="Sequences this replica runs in vLLM at once: None for max_num_seqs, an int for a fixed limit "
        "(at most max_num_seqs), `adaptive` for a limit sized by the measured TPOT (`adaptive`).",
    )
    newcomer_slots: int = Field(
        2, ge=0,
        description="Slots above the dispatch limit that only a tenant running fewer than its weighted share of "
        "the limit may take, so its request starts at once (vLLM runs max_num_seqs + newcomer_slots).",
    )
    max_queued: int = Field(
        24, ge=1,
        description="Requests queued on a replica at most; past it the newest request of the tenant furthest over "
        "its share is refused (503, reason fair_share).",
    )
    aging_s: float = Field(
        10.0, gt=0,
        description="While a higher priority is backlogged, a lower one whose oldest request waited this long "
        "still gets one dispatch per aging_s.",
    )
    max_prefilling_per_tenant: Optional[int] = Field(
        None, ge=1,
        description="Requests of one tenant in prefill at once (dispatched, first token not out) while another "
        "tenant is active; None: no pacing.",
    )
    prompt_token_cost: float = Field(1.0, ge=0, description="Virtual-counter cost of one prompt token.")
    completion_token_cost: float = Field(
        2.0, ge=0, description="Virtual-counter cost of one completion token.")
    deadline_margin_s: float = Field(
        0.5, ge=0,
        description="A queued request this close to its deadline is refused (503, reason queue_deadline, never "
        "billed) rather than started.",
    )
    retry_after_s: int = Field(2, ge=1, description="Retry-After of a request the queue refuses, in seconds.")
    batch_max_share: float = Field(
        0.5, gt=0, le=1,
        description="Most of the dispatch limit Batch API lines may hold at once (at least one sequence); they "
        "start only while no online request is queued.",
    )
    slack_bound_tokens: float = Field(
        1000.0, ge=0,
        description="With engine.tenant_scheduler.slo_classes on, the fairness bound of admission by TTFT slack: "
        "a tenant whose virtual counter is more than this (weighted tokens per unit of weight, about one long "
        "prompt) above its tier's lowest waiting one is dispatched by counter, not ahead by slack.")
    adaptive: AdaptiveLimitConfig = Field(
        default_factory=AdaptiveLimitConfig,
        description="How the dispatch limit adapts when dispatch_limit is `adaptive`.",
    )

    @field_validator("dispatch_limit")
    @classmethod
    def _positive_limit(cls, value):
        if isinstance(value, int) and value < 1:
            raise ValueError("fair_queue.dispatch_limit must be at least 1 (or null: max_num_seqs, or 'adaptive')")
        return value


class TenantSchedulerConfig(BaseModel):
    """Tenant fairness inside vLLM's step (engine/tenant_scheduler.py; docs/operations.md)."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(
        True, description="Run vLLM's scheduler with LoRAPlex's tenant step plan (docs/operations.md); false: "
        "vLLM's default scheduler.")
    tpot_s: Optional[float] = Field(
        None, gt=0, description="Time per output token a step shared by tenants is sized for when none of its "
        "requests has an SLO class with a TPOT target; None: the `slo:` tpot_p95_s.")
    step_share: float = Field(
        0.8, gt=0, le=1, description="A shared step's target time as a share of its TPOT target (the tightest "
        "SLO class's with decodes in the step, else tpot_s).")
    slo_classes: bool = Field(
        False, description="Keep each request's SLO class (slo.classes): a shared step is sized to the tightest "
        "TPOT target among the classes with decodes in it, and, while requests of two or more TTFT targets "
        "wait, prefill goes by TTFT slack within slack_bound_s and the fair queue admits by TTFT slack within "
        "fair_queue.slack_bound_tokens; false (the default until it is shown to help "
        "on the real engine: docs/operations.md, SLO classes): every step is sized to tpot_s, and prefill and "
        "the fair queue go by counter alone (the single-SLO scheduler).")
    slack_bound_s: float = Field(
        1.0, ge=0, description="The fairness bound of the order by TTFT slack: a tenant whose virtual counter is "
        "more than this (engine-seconds per unit of weight) above its tier's lowest waits its turn by "
        "counter, so a tight class is served first without taking more than its share over time.")
    min_prompt_tokens: int = Field(
        32, ge=1, description="Floor of a shared step's prompt tokens, and the least share of them worth giving a "
        "tenant in a step.")
    max_prompt_tokens: Optional[int] = Field(
        None, ge=1, description="Ceiling of any step's prompt tokens; None: vLLM's token budget "
        "(max_num_batched_tokens) less the step's decodes.")
    idle_grace_s: float = Field(
        10.0, ge=0, description="How long a tenant whose work left the engine still counts as sharing it; 0: not "
        "at all.")
    pause_batch: bool = Field(
        True, description="Batch API lines pause (their KV kept) in every step that has an online request and go "
        "on when none is left; false: a started line keeps decoding beside online work.")
    cost_horizon_steps: int = Field(
        500, ge=10, description="Memory of the step-cost fit, in steps: a step this many steps old weighs 1/e.")
    cost_min_steps: int = Field(
        20, ge=1, description="Steps measured before the fit replaces the built-in prior (the CPU profile's "
        "figures).")

    def settings(self) -> dict[str, Any]:
        """What the scheduler in EngineCore reads (tenant_scheduler.TenantSchedulerSettings)."""
        return {"step_target_s": self.tpot_s * self.step_share if self.tpot_s is not None else None,
                "min_prompt_tokens": self.min_prompt_tokens, "max_prompt_tokens": self.max_prompt_tokens,
                "idle_grace_s": self.idle_grace_s, "pause_batch": self.pause_batch,
                "horizon_steps": self.cost_horizon_steps, "min_steps": self.cost_min_steps,
                "step_share": self.step_share, "classes": self.slo_classes, "slack_bound_s": self.slack_bound_s}


class EngineConfig(BaseModel):
    """vLLM engine settings for every Engine replica. Unknown keys are refused so typos surface."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    model: str = Field(
        "models/SmolLM2-135M-Instruct",
        description="HF model id or local model dir (a relative dir is resolved against where `serve run` "
        "started).",
    )
    served_model_name: Optional[str] = Field(
        None, description="Model id clients send and /v1/models lists; defaults to the dir name."
    )
    max_model_len: Optional[int] = Field(
        2048, gt=0, description="Longest prompt + completion, in tokens."
    )
    max_num_seqs: int = Field(32, gt=0, description="Most requests batched at once per replica.")
    max_num_batched_tokens: Optional[int] = Field(
        None, gt=0, description="Token budget of one scheduler step (chunked prefill)."
    )
    enable_lora: bool = Field(True, description="Serve per-tenant LoRA adapters.")
    max_loras: int = Field(4, gt=0, description="Adapters resident in one batch (GPU slots).")
    max_cpu_loras: Optional[int] = Field(
        16, gt=0, description="Adapters kept in host memory per replica; LRU beyond this."
    )
    max_cpu_lora_bytes: Optional[int] = Field(
        None, gt=0,
        description="Bytes of adapter weights kept in host memory per replica (vLLM's CPU tier), beside "
        "max_cpu_loras: least recently used idle, unpinned adapters go first; null: no byte bound.",
    )
    max_lora_rank: int = Field(16, gt=0, description="Highest adapter rank accepted.")
    dtype: str = Field("auto", description="Weight/activation dtype (auto, float32, bfloat16, float16); auto on the "
                       "CPU backend: bfloat16 if the CPU has native bf16 (avx512_bf16 / amx_bf16), else float32.")
    cpu_nice: int = Field(
        4, ge=0, le=19,
        description="CPU backend: steps of niceness vLLM's EngineCore runs below the replica (Ray runs replicas "
        "and Serve's proxy at 15; at most 19), so the front door gets a core first; 0 leaves it equal.")
    gpu_memory_utilization: float = Field(
        0.9,
        gt=0,
        le=1,
        description="Share of accelerator memory (host RAM on the CPU backend) for weights + KV cache.",
    )
    tensor_parallel_size: int = Field(1, gt=0, description="GPUs one replica shards over.")
    enable_prefix_caching: bool = Field(True, description="Reuse KV blocks of shared prefixes.")
    enable_chunked_prefill: bool = Field(True, description="Mix prefill chunks with decodes.")
    seed: int = Field(0, description="Sampling seed for reproducible runs.")
    scheduling_policy: Literal["priority", "fcfs"] = Field(
        "priority",
        description="vLLM's order of waiting requests: `priority` by their tenant's `priority` limit (higher "
        "first), `fcfs` by arrival.",
    )
    tenant_scheduler: TenantSchedulerConfig = Field(
        default_factory=TenantSchedulerConfig,
        description="Tenant fairness inside vLLM's step: a TPOT-sized prompt budget for steps tenants share, "
        "split by virtual counters.")
    engine_kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="Any other vllm AsyncEngineArgs field, passed through unchanged (a field this config has is "
        "refused here: set it where the platform reads it too).",
    )

    @field_validator("engine_kwargs")
    @classmethod
    def _no_typed_fields(cls, kwargs: dict[str, Any]) -> dict[str, Any]:
        typed = sorted(k for k in kwargs if k in cls.model_fields and k != "engine_kwargs")
        if typed:
            raise ValueError(f"engine_kwargs sets {', '.join(typed)}: set engine.{typed[0]} (and the others) "
                             "directly, where the platform reads them too")
        return kwargs

    @model_validator(mode="after")
    def _one_scheduler(self) -> "EngineConfig":
        if self.tenant_scheduler.enabled and "scheduler_cls" in self.engine_kwargs:
            raise ValueError("engine_kwargs.scheduler_cls replaces the tenant scheduler: set "
                             "engine.tenant_scheduler.enabled: false to run your own scheduler class")
        return self

    @property
    def model_id(self) -> str:
        return self.served_model_name or Path(self.model).name

    def resolved(self, base_dir: Path) -> "EngineConfig":
        """Make a relative local model dir absolute: replicas run with another cwd."""
        path = Path(self.model)
        if not path.is_absolute() and (base_dir / path).exists():
            return self.model_copy(update={"model": str((base_dir / path).resolve())})
        return self

    def engine_args(self) -> dict[str, Any]:
        args = {
            "model": self.model,
            "served_model_name": [self.model_id],
            "max_model_len": self.max_model_len,
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "enable_lora": self.enable_lora,
            "dtype": self.dtype,
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "tensor_parallel_size": self.tensor_parallel_size,
            "enable_prefix_caching": self.enable_prefix_caching,
            "enable_chunked_prefill": self.enable_chunked_prefill,
            "seed": self.seed,
            "scheduling_policy": self.scheduling_policy,
        }
        if self.enable_lora:
            args.update(
                max_loras=self.max_loras,
                max_cpu_loras=self.max_cpu_loras,
                max_lora_rank=self.max_lora_rank,
            )
        args = {k: v for k, v in args.items() if v is not None}
        return {**args, **self.engine_kwargs}


class EngineDeploymentConfig(BaseModel):
    """How many Engine replicas run and what each reserves from Ray."""

    model_config = ConfigDict(extra="forbid")

    num_replicas: int = Field(
        1, gt=0,
        description="Engine replicas when the app is built (in a serve config, scale with `deployments:` instead: "
        "docs/deploy.md).",
    )
    autoscaling: Optional[dict[str, Any]] = Field(
        None,
        description="Ray Serve's autoscaling_config for the Engine, for apps built in Python (in a serve config, "
        "the `deployments:` entry's wins: docs/deploy.md); excludes num_replicas.",
    )
    num_cpus: float = Field(1.0, ge=0, description="Logical CPUs Ray reserves per replica.")
    num_gpus: float = Field(
        0.0, ge=0, description="GPUs per replica; set it to tensor_parallel_size on GPU nodes."
    )
    max_ongoing_requests: int = Field(
        64, gt=0, description="Requests Serve sends one replica at once before queueing."
    )
    health_check_period_s: float = Field(
        10.0, gt=0, description="How often Serve runs each replica's health check (a 1-token generation, skipped "
        "while the engine made progress within ready_probe_max_age_s / 2)."
    )
    health_check_timeout_s: float = Field(
        60.0, gt=0, description="A probe slower than this marks the replica unhealthy."
    )
    graceful_shutdown_timeout_s: float = Field(
        60.0, ge=0,
        description="How long a leaving replica lets its running requests finish before it flushes its usage "
        "spool and exits (the rest are cut and billed for what they made).",
    )
    ready_probe_max_age_s: float = Field(
        30.0, gt=0, description="The health check probes an engine that made no progress for half this long (GET "
        "/readyz always probes)."
    )
    caller_check_s: float = Field(
        0.5, gt=0,
        description="How often a replica checks that the Ingress replicas whose requests it runs still exist, "
        "aborting a dead one's requests (billed as client_disconnect).",
    )
    stream_window_s: float = Field(
        0.05, ge=0,
        description="Longest a streamed chunk waits to be sent with later ones in one Ray stream item (the first "
        "chunk never waits); 0: every chunk alone.",
    )
    stream_max_chunks: int = Field(
        64, gt=0, description="Most chunks (tokens) coalesced into one stream item; 1: no coalescing."
    )
    stream_items_per_s: float = Field(
        500.0, gt=0,
        description="Stream items per second one replica aims to send over all its streams: "
        "under load the window widens to active streams / this (up to stream_max_window_s).",
    )
    stream_max_window_s: float = Field(
        0.5, gt=0, description="The widest the coalescing window gets under load."
    )
    max_queued_requests: int = Field(
        256, gt=0,
        description="Requests an ingress replica holds for this pool while every replica has "
        "max_ongoing_requests; past it the caller gets 503 + Retry-After.",
    )
    resources: dict[str, float] = Field(
        default_factory=dict,
        description="Ray custom resources each replica of this pool reserves, to place it on the nodes that offer "
        "them (docs/deploy.md, \"Several base models on a GPU cluster\").",
    )
    cpu_affinity: Optional[list[int]] = Field(
        None, min_length=1,
        description="CPU ids this pool's replicas and their vLLM processes run on (CPU backend; null: any; "
        "docs/operations.md, \"Several base models\").",
    )
    shedding: SheddingConfig = Field(
        default_factory=SheddingConfig,
        description="When a replica refuses new work (503 + Retry-After), lowest priority first.",
    )
    routing: RoutingConfig = Field(
        default_factory=RoutingConfig,
        description="How ingress replicas pick an Engine replica: tenant affinity under a load bound by default.",
    )
    fair_queue: FairQueueConfig = Field(
        default_factory=FairQueueConfig,
        description="Per-tenant fair queue in front of vLLM (VTC): the dispatch limit, tiers, weights, refusal by "
        "share (docs/operations.md).",
    )

    @field_validator("autoscaling")
    @classmethod
    def _serve_autoscaling_config(cls, value: Optional[dict[str, Any]]) -> Optional[dict[str, Any]]:
        if value is not None:
            from ray.serve.config import AutoscalingConfig

            AutoscalingConfig(**value)  # Serve's own validation: unknown keys, min <= max, ...
        return value

    @model_validator(mode="after")
    def _replicas_or_autoscaling(self) -> "EngineDeploymentConfig":
        if self.autoscaling is not None and "num_replicas" in self.model_fields_set:
            raise ValueError("engine_deployment: set num_replicas or autoscaling, not both "
                             "(autoscaling's min_replicas/max_replicas bound the count)")
        return self
