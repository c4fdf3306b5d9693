"""PlatformConfig: everything `serve_config.yaml`'s `args:` can set, validated in one place."""

from __future__ import annotations

from bisect import bisect_right
from pathlib import Path
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from loraplex.accounting.config import DEFAULT_PLAN, AccountingConfig
from loraplex.batches.config import BatchConfig
from loraplex.console.config import ConsoleConfig
from loraplex.metrics.config import MetricsConfig
from loraplex.routing.config import RoutingConfig
from loraplex.tenancy.config import TenancyConfig




class AdaptiveLimitConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    initial: Optional[int] = Field(
        None, ge=1,
        description="The adaptive dispatch limit at start. None: max_num_seqs, so a new replica serves "
        "as vLLM alone would until its TPOT says otherwise (started at 4, a CPU replica queued a "
        "tenant's 16 requests for the ~25 s slow start took to reach 16; a smaller start then "
        "doubles per window, `slow_start`).")
    min_limit: int = Field(
        2, ge=1,
        description="The lowest the adaptive limit falls (at most max_num_seqs): on an engine that "
        "misses its targets even at small batches (a loaded CPU), backing off to 1 runs one request "
        "at a time and cuts throughput without meeting the targets either.")
    tpot_s: Optional[float] = Field(
        None, gt=0, description="Target time per output token, the one latency the limit follows; None: the "
        "`slo:` tpot_p95_s. Time to first token is not judged: while requests queue, a smaller batch moves "
        "their wait from vLLM's prefill into the queue, it does not shorten it (docs/operations.md).")

    window: int = Field(20, ge=1, description="Finished requests per decision to raise or lower the limit.")
    window_s: Optional[float] = Field(
        10.0, gt=0, description="A decision is also taken this many seconds into a window once it holds a report "
        "per slot (at least min(window, limit) finished requests): on a CPU, where a request holds its slot "
        "10-20 s, 20 reports at a limit of 4 take a minute. None: by `window` alone.")
    slow_share: float = Field(
        0.05, ge=0, lt=1, description="Share of a window's requests over a target that lowers the limit (p95: 0.05).")
    backoff: float = Field(0.75, gt=0, lt=1, description="The limit is multiplied by this when lowered.")
    slow_start: bool = Field(
        True, description="Until the limit is first lowered, a window within the targets with demand for "
        "more slots doubles it (TCP's slow start) instead of adding 1: from an `initial` of 4 to a GPU's 256 in "
        "6 windows, not 252, and on a slow CPU to a batch the SLO allows within a minute, not ten.")

    @model_validator(mode="before")
    @classmethod
    def _no_ttft_target(cls, data):
        if isinstance(data, dict) and "ttft_s" in data:
            raise ValueError(
                "fair_queue.adaptive.ttft_s is no longer read: the adaptive dispatch limit follows time per "
                "output token only (a smaller batch does not shorten time to first token while requests "
                "queue; docs/operations.md). Remove it; set adaptive.tpot_s or slo.tpot_p95_s instead.")
        return data


class SheddingConfig(BaseModel):
    """When an Engine replica refuses new requests: by the tenant's priority, and only a tenant over
    its share of the replica (engine/shedding.py)."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(True, description="Refuse new work when the replica is overloaded.")
    shed_requests: int = Field(
        48, ge=0,
        description="Sequences in vLLM on a replica (running + waiting there) at which priority-0 "
        "requests of tenants over their share are refused. With the fair queue on, vLLM holds only what the queue dispatched (at "
        "most max_num_seqs) and the queue bounds the rest (fair_queue.max_queued, refused by share): "
        "the default 48 is then never reached on the CPU profile; set it below max_num_seqs to refuse "
        "low priorities before the batch is full (a value at or above it is refused as unreachable).",
    )
    max_requests: int = Field(
        128, ge=0, description="Requests in vLLM at which every request is refused (priority 100); "
        "priorities in between are refused at a linear share of the way. Above max_num_seqs with the "
        "fair queue on: the top priority is never refused by count.",
    )
    requests_by_priority: Optional[dict[int, int]] = Field(
        None,
        description="Requests in flight on a replica at which each listed priority is refused, "
        "e.g. {0: 1, 50: 2, 100: 8}: a priority between two listed ones is refused at the linear "
        "share of the way, one below the lowest or above the highest at that point's count. "
        "Replaces shed_requests / max_requests when set; counts may not fall as priority rises.",
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

    enabled: bool = Field(True, description="Queue per tenant and dispatch fairly; false: every "
                          "request goes to vLLM at once (only shedding bounds it).")
    dispatch_limit: Union[int, Literal["adaptive"], None] = Field(
        None,
        description="Requests this replica runs in vLLM at once (running + waiting there). None: "
        "engine.max_num_seqs, work-conserving (the queue is then a backstop that bounds what waits and "
        "refuses by share, while fairness between running requests is the tenant scheduler's, inside "
        "vLLM's step); an int: a fixed limit (at most max_num_seqs); `adaptive`: between adaptive.min_limit "
        "and max_num_seqs by the measured TPOT against `adaptive`'s target.",
    )
    newcomer_slots: int = Field(
        2, ge=0,
        description="Slots above the dispatch limit that only a tenant running fewer than its weighted "
        "share of the limit (at least 1: one with nothing running) may take: its request starts at once "
        "instead of waiting for another tenant's slot to free. While its tenant has nothing queued it does "
        "not count against the limit, so a backlogged tenant keeps all of the limit's slots beside it. "
        "vLLM is started with max_num_seqs + newcomer_slots sequences, so the reserve exists beside a full "
        "batch too.",
    )
    max_queued: int = Field(
        24, ge=1,
        description="Requests queued on a replica at most; past it the newest request of the tenant "
        "furthest over its share is refused (503, reason fair_share). Keep max_queued + max_num_seqs "
        "+ newcomer_slots under the Engine's max_ongoing_requests, or Serve queues by arrival first.",
    )
    aging_s: float = Field(
        10.0, gt=0,
        description="While a higher priority is backlogged, a lower one whose oldest request waited "
        "this long still gets one dispatch per aging_s: no tier starves. Never reorders one priority's tenants.",
    )
    max_prefilling_per_tenant: Optional[int] = Field(
        None, ge=1,
        description="Requests of one tenant in prefill at once (dispatched, first token not out); "
        "its next waits for one's first token. Spreads a backlogged tenant's refills over the steps, "
        "so other tenants' decodes never stall behind all its prompts at once. None: no pacing.",
    )
    prompt_token_cost: float = Field(1.0, ge=0, description="Virtual-counter cost of one prompt token.")
    completion_token_cost: float = Field(
        2.0, ge=0, description="Virtual-counter cost of one completion token (the paper's 2: a decode "
        "step costs more than a prefill token).")
    deadline_margin_s: float = Field(
        0.5, ge=0,
        description="A queued request whose deadline is this close is refused (503, reason "
        "queue_deadline, never billed) rather than started too late to finish.",
    )
    retry_after_s: int = Field(2, ge=1, description="Retry-After of a request the queue refuses, in seconds.")
    batch_max_share: float = Field(
        0.5, gt=0, le=1,
        description="Most of the dispatch limit Batch API lines may hold at once (at least one sequence). They "
        "start only while no online request is queued; the slots they leave free are what an online burst "
        "starts in at once, and every slot a line frees goes to queued online work first.",
    )
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

# The service-level objectives the alert rules and the dashboard are generated from. Replicas
# read only the TPOT target (the adaptive dispatch limit's, PlatformConfig.for_replicas) and the
# ingress the TTFT/TPOT targets (GET /admin/latency's): `python -m loraplex.observability` turns them (with the rest of
# PlatformConfig: replica counts, prices) into Prometheus rules and a Grafana dashboard, so the
# targets live in serve_config.yaml once and the alerts never drift from them. Pick latency
# targets on a bucket boundary of the latency histograms: P95 is interpolated inside a bucket.
class SloConfig(BaseModel):
    """Targets and alert thresholds. The defaults suit the CPU profile (serve_config.yaml)."""

    model_config = ConfigDict(extra="forbid")

    ttft_p95_s: float = Field(
        2.5, gt=0, description="Time to first token, 95th percentile over all tenants, in seconds: "
        "alert LoraplexTTFTOverSLO fires above it.")
    tpot_p95_s: float = Field(
        0.3, gt=0, description="Time per output token (decode pace), 95th percentile, in seconds: "
        "alert LoraplexTPOTOverSLO fires above it.")
    availability: float = Field(
        0.99, gt=0, lt=1, description="Share of requests that must not fail or be shed (30-day "
        "objective). LoraplexErrorBudgetBurn fires when failures burn its budget 14.4x too fast "
        "(over 1 h and 5 min alike): the month's budget would be gone in about 2 days.")
    error_rate: float = Field(
        0.05, gt=0, le=1, description="Share of engine requests ending in an error or timeout "
        "(over window_s) above which LoraplexErrorRateHigh fires.")
    shed_rate: float = Field(
        0.05, gt=0, le=1, description="Share of requests refused with 503 (load shedding, full "
        "queues) above which LoraplexShedRateHigh fires.")
    kv_usage_alert: float = Field(
        0.9, gt=0, le=1, description="KV-cache usage (0..1) of a replica above which "
        "LoraplexKVCacheNearlyFull fires: preemption is near, the earliest capacity alarm.")
    spool_flush_max_age_s: int = Field(
        120, gt=0, description="A replica whose usage spool has not been copied into the "
        "database for this long fires LoraplexUsageSpoolNotFlushing (it flushes every "
        "accounting.flush_interval_s when healthy).")
    window_s: int = Field(
        300, ge=60, description="Rate window of the latency, error and shed alerts, in seconds "
        "(at least 60: four scrapes at the default 15 s interval).")
    for_s: int = Field(
        300, ge=0, description="How long a condition must hold before its alert fires, in seconds.")

    @model_validator(mode="after")
    def _budget_burnable(self) -> "SloConfig":
        if (1 - self.availability) * 14.4 > 1:
            raise ValueError("availability below 0.9306: a 14.4x burn of its budget is over 100 % errors")
        return self


class TenantSchedulerConfig(BaseModel):
    """Tenant fairness inside vLLM's step (engine/tenant_scheduler.py; docs/operations.md)."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(
        True, description="Run vLLM's scheduler with LoRAPlex's tenant step plan: decodes first; a step "
        "shared by two or more tenants carries only the prompt tokens that keep it within the TPOT "
        "target (long prompts cut into chunks), split across tenants by their virtual counters. One "
        "tenant's steps are vLLM's own. false: vLLM's default scheduler.")
    tpot_s: Optional[float] = Field(
        None, gt=0, description="Time per output token a shared step is sized for; None: the `slo:` "
        "tpot_p95_s.")
    step_share: float = Field(
        0.8, gt=0, le=1, description="A shared step's target time as a share of tpot_s: headroom for the "
        "cost fit's error and for steps it mispredicts, since TPOT is judged at the 95th percentile.")
    min_prompt_tokens: int = Field(
        32, ge=1, description="Floor of a shared step's prompt tokens (prompts always progress, even when "
        "the decodes alone take the whole target) and the least share worth giving a tenant in a step: "
        "past budget / this many prompting tenants, the ones with the highest counters wait a step.")
    max_prompt_tokens: Optional[int] = Field(
        None, ge=1, description="Ceiling of any step's prompt tokens; None: vLLM's token budget "
        "(max_num_batched_tokens) less the step's decodes.")
    idle_grace_s: float = Field(
        10.0, ge=0, description="A tenant whose work left the engine this recently still counts as sharing "
        "it: the steps stay sized for it, so its next request (a chat client's follows its last within "
        "moments) does not arrive during an uncapped step of another tenant's prompts and wait it out (2,048 "
        "prompt tokens take ~6 s on this CPU). 0: a tenant alone the moment the others' requests end.")
    pause_batch: bool = Field(
        True, description="Batch API lines pause (their KV kept) in every step that has an online request, "
        "running or waiting, and go on when none is left: online decodes never share a step with a batch line, "
        "so a batch costs the online tenants' TPOT nothing (on this CPU a decode step grows ~7 ms a sequence). "
        "false: a batch line that started keeps decoding beside online work (none starts while online work "
        "waits, fair_queue.batch_max_share): more batch throughput, for some online TPOT; on a GPU, whose decode "
        "step is near-flat in its batch size, the cheaper trade.")
    cost_horizon_steps: int = Field(
        500, ge=10, description="Memory of the step-cost fit (seconds per step, per decode token, per "
        "prompt token, refitted after every step): a step this many steps old weighs 1/e.")
    cost_min_steps: int = Field(
        20, ge=1, description="Steps measured before the fit replaces the built-in prior (the CPU "
        "profile's figures).")

    def settings(self) -> dict[str, Any]:
        """What the scheduler in EngineCore reads (tenant_scheduler.TenantSchedulerSettings)."""
        return {"step_target_s": self.tpot_s * self.step_share if self.tpot_s is not None else None,
                "min_prompt_tokens": self.min_prompt_tokens, "max_prompt_tokens": self.max_prompt_tokens,
                "idle_grace_s": self.idle_grace_s, "pause_batch": self.pause_batch,
                "horizon_steps": self.cost_horizon_steps, "min_steps": self.cost_min_steps}


class EngineConfig(BaseModel):
    """vLLM engine settings for every Engine replica. Unknown keys are refused so typos surface."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    model: str = Field(
        "models/SmolLM2-135M-Instruct",
        description="HF model id or local model dir. A relative dir is resolved against the "
        "directory `serve run` was started in.",
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
        description="Bytes of adapter weights kept in host memory per replica (vLLM's CPU tier), on top of "
        "max_cpu_loras: after each load the least recently used idle, unpinned adapters are removed until "
        "the tier fits (each loads again on its next use). null: max_cpu_loras alone bounds it.",
    )
    max_lora_rank: int = Field(16, gt=0, description="Highest adapter rank accepted.")
    dtype: str = Field("auto", description="Weight/activation dtype (auto, bfloat16, float16).")
    gpu_memory_utilization: float = Field(
        0.9,
        gt=0,
        le=1,
        description="Share of accelerator memory for weights + KV cache. On the CPU backend "
        "this is a share of host RAM: keep it near 0.25 on a 24 GiB machine.",
    )
    tensor_parallel_size: int = Field(1, gt=0, description="GPUs one replica shards over.")
    enable_prefix_caching: bool = Field(True, description="Reuse KV blocks of shared prefixes.")
    enable_chunked_prefill: bool = Field(True, description="Mix prefill chunks with decodes.")
    seed: int = Field(0, description="Sampling seed for reproducible runs.")
    scheduling_policy: Literal["priority", "fcfs"] = Field(
        "priority",
        description="vLLM's scheduler: `priority` runs waiting requests by their tenant's "
        "`priority` limit (higher first; a higher-priority arrival may preempt a lower one), "
        "`fcfs` in arrival order. Clients never choose a request's priority.",
    )
    tenant_scheduler: TenantSchedulerConfig = Field(
        default_factory=TenantSchedulerConfig,
        description="Tenant fairness inside vLLM's step: a TPOT-sized prompt budget for steps tenants "
        "share, split by virtual counters (docs/operations.md).")
    engine_kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="Any other vllm AsyncEngineArgs field, passed through unchanged. A field this "
        "config has (max_num_seqs, max_loras, ...) is refused here: the platform reads its own "
        "(the fair queue's cap, the pin limit, the model id), so vLLM and it would disagree.",
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
        description="Engine replicas (each a full vLLM engine) when the app is built. In a serve "
        "config, scale with `deployments: [{name: Engine, num_replicas: N}]` instead: Serve "
        "applies that in place, while any change under `args` replaces every replica.",
    )
    autoscaling: Optional[dict[str, Any]] = Field(
        None,
        description="Ray Serve's autoscaling_config for the Engine (min_replicas, max_replicas, "
        "target_ongoing_requests, upscale_delay_s, downscale_delay_s, ...), for apps built in "
        "Python. In a serve config, set `autoscaling_config` in the `deployments:` entry instead: "
        "Serve applies it in place and it wins over this one (a change here, under `args`, "
        "replaces every replica). Excludes num_replicas.",
    )
    num_cpus: float = Field(1.0, ge=0, description="Logical CPUs Ray reserves per replica.")
    num_gpus: float = Field(
        0.0, ge=0, description="GPUs per replica; set it to tensor_parallel_size on GPU nodes."
    )
    max_ongoing_requests: int = Field(
        64, gt=0, description="Requests Serve sends one replica at once before queueing."
    )
    health_check_period_s: float = Field(
        10.0, gt=0, description="How often Serve runs each replica's health check: a 1-token generation, "
        "skipped while the engine made progress within ready_probe_max_age_s / 2."
    )
    health_check_timeout_s: float = Field(
        60.0, gt=0, description="A probe slower than this marks the replica unhealthy."
    )
    graceful_shutdown_timeout_s: float = Field(
        60.0, ge=0,
        description="On scale-down, redeploy or shutdown, a replica takes no new requests and "
        "lets its running ones finish for up to this long; then it flushes its usage spool to the "
        "database and exits. Requests still running then are cut (and billed for what they made).",
    )
    ready_probe_max_age_s: float = Field(
        30.0, gt=0, description="The health check probes an engine that made no progress (a token "
        "generated, or a probe) for half this long; a busy engine is not probed, since a probe waits "
        "behind its queued prefills. GET /readyz always runs a probe."
    )
    caller_check_s: float = Field(
        0.5, gt=0,
        description="While a replica runs requests of an Ingress replica, it checks this often that the Ingress "
        "replica still exists; a dead one's requests are aborted (billed as client_disconnect), since Ray does "
        "not cancel a call whose caller died.",
    )
    stream_window_s: float = Field(
        0.05, ge=0,
        description="Longest a streamed chunk waits to be sent with later ones in one Ray stream "
        "item (the first chunk never waits) while the replica is within stream_items_per_s. "
        "Each item costs the hops a fixed CPU time, so one item per token caps a replica far "
        "below a GPU's token rate. 0: no coalescing, every chunk alone.",
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
        description="Requests an ingress replica holds for the Engine deployment while every "
        "replica has max_ongoing_requests; past this the caller gets 503 + Retry-After at once.",
    )
    resources: dict[str, float] = Field(
        default_factory=dict,
        description="Ray custom resources each replica of this pool reserves, to place a base's pool on the nodes "
        "that offer them (e.g. {\"a100-80g\": 1} for a large base; the nodes start with `ray start "
        "--resources='{\"a100-80g\": 8}'`). docs/deploy.md, \"Several base models on a GPU cluster\".",
    )
    cpu_affinity: Optional[list[int]] = Field(
        None, min_length=1,
        description="CPU ids this pool's replicas and their vLLM processes run on (CPU backend; null: any). On one "
        "node with several base models, give each pool its own cores so one base's load cannot slow the other's "
        "tenants (docs/operations.md, \"Several base models\"). An id the node lacks stops the replica at start.",
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
        description="Per-tenant fair queue in front of vLLM (VTC): the dispatch limit, tiers, weights, "
        "shedding by share (docs/operations.md).",
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


DEFAULT_POOL = "Engine"  # the first base's Engine deployment: the name single-model configs always had


def _none_as_empty(cls, value: Any) -> Any:
    """An `engine:` key left empty in YAML (None) means every default, as if it were left out."""
    return {} if value is None else value


def _unserved(names, bases: list[str]) -> list[str]:
    """`names` (in their order) that are none of the app's bases: a setting for a base that is
    not served is stored and never applies (a typo bills at the plan's prices or leaves a tenant
    unlimited), so the validators below refuse it, naming the bases."""
    return [name for name in names if name not in bases]


class BaseModelConfig(BaseModel):
    """One base model and its own pool of Engine replicas: its router, fair queue, shedding and
    autoscaling see only this pool; its tenants' adapters are bound to it (docs/operations.md,
    "Several base models")."""

    model_config = ConfigDict(extra="forbid")

    name: Optional[str] = Field(
        None,
        description="What clients send as `model` and /v1/models lists: the same as engine.served_model_name "
        "(set one of them, or neither for the model dir's name). Unique across `models`.",
    )
    engine: EngineConfig = Field(default_factory=EngineConfig, description="vLLM settings of this base's replicas.")
    engine_deployment: EngineDeploymentConfig = Field(
        default_factory=EngineDeploymentConfig,
        description="This base's Engine pool: replicas or autoscaling, resources, fair queue, routing, shedding.",
    )

    _allow_none = field_validator("engine", mode="before")(classmethod(_none_as_empty))

    @model_validator(mode="after")
    def _name_is_the_served_name(self) -> "BaseModelConfig":
        served = self.engine.served_model_name
        if self.name is not None and served is not None and served != self.name:
            raise ValueError(f"name {self.name!r} and engine.served_model_name {served!r} differ: clients send one "
                             "name for a base; set only `name`")
        if self.name is not None:
            self.engine = self.engine.model_copy(update={"served_model_name": self.name})
        return self

    @property
    def model_id(self) -> str:
        """The base's name: what clients send, what usage records and prices say."""
        return self.engine.model_id


class IngressDeploymentConfig(BaseModel):
    """The HTTP front door: OpenAI, tenant and admin routes."""

    model_config = ConfigDict(extra="forbid")

    num_replicas: int = Field(
        1, gt=0,
        description="Ingress replicas when the app is built; in a serve config, scale with "
        "`deployments: [{name: Ingress, num_replicas: N}]` (applied in place).",
    )
    num_cpus: float = Field(0.5, ge=0, description="Logical CPUs Ray reserves per replica.")
    max_ongoing_requests: int = Field(
        256, gt=0,
        description="Generation requests (chat, completions; streams until their end) in progress per "
        "replica; one more gets 503 + Retry-After at once (refusal `503:ingress_busy`), never a wait. "
        "Health, admin and usage routes are not counted (ingress/overload.py).",
    )
    max_request_body_bytes: int = Field(
        1 << 20, gt=0, description="Bigger JSON bodies on /v1 generation routes get 413."
    )
    ready_cache_s: float = Field(
        3.0, ge=0,
        description="GET /readyz (unauthenticated) runs a real 1-token generation and a controller call at "
        "most once per this many seconds per ingress replica, answering from the last result in between: "
        "a client hammering it costs a lookup, not a generation. 0: every call probes.",
    )
    body_timeout_s: float = Field(
        10.0, gt=0,
        description="A generation request's body must arrive within this long of its first read, else 408 "
        "(refusal `408:body_timeout`); as nginx's client_body_timeout. Its tenant's concurrency slot "
        "(max_concurrent_requests) is taken before the body is read, so a tenant trickling bodies holds "
        "its own slots, not every tenant's ingress (max_ongoing_requests).",
    )
    max_body_reads_per_tenant: Optional[int] = Field(
        64, gt=0,
        description="Request bodies one tenant may have arriving at once on one ingress replica; one more gets "
        "429 + Retry-After (code `body_reads`) before it is read. Bounds a tenant without "
        "max_concurrent_requests trickling bodies: it holds at most this many of max_ongoing_requests (an "
        "honest body arrives in milliseconds, so even a burst rarely has many being read). null: unbounded.",
    )
    request_timeout_s: float = Field(
        300.0, gt=0,
        description="Deadline of a generation request, from its arrival: the engine request is "
        "aborted then (504, or an error event in a stream; billed as `timeout`). A client may "
        "ask for less with the header X-LoRAPlex-Timeout, never more. Keep it under the proxy's "
        "http_options.request_timeout_s, or the proxy cuts the stream first, without an error event.",
    )
    idempotency_window_s: float = Field(
        600.0, ge=0,
        description="A generation request with an Idempotency-Key header keeps its reply this long after it ends: "
        "the same tenant sending the same key and body again gets that reply (billed once; one still running "
        "is waited for), the same key with another body is a 422; such a request runs to its end even if "
        "its client goes away. 0: the header is ignored.",
    )
    max_migrations: int = Field(
        2, ge=0,
        description="Times a generation request may move to another Engine replica when its replica is lost "
        "mid-request (docs/operations.md, fault table): resent whole if nothing was delivered yet, else a "
        "stream continued from the text its client has, billed once. 0: off (the client gets the error event).",
    )


class RegistryConfig(BaseModel):
    """Where tenants' adapters live and what an upload may be."""

    model_config = ConfigDict(extra="forbid")

    store_url: str = Field(
        "adapters",
        description="Adapter store: a local dir (single node) or any fsspec URL such as "
        "s3://bucket/prefix or gs://bucket/prefix (multi-node clusters).",
    )
    storage_options: dict[str, Any] = Field(
        default_factory=dict, repr=False,
        description="fsspec options for store_url (endpoint, credentials). Left out of repr(): it may hold "
        "S3 keys (prefer the environment's AWS_* variables or an instance role for those).",
    )
    store_shared: bool = Field(
        False,
        description="store_url is a local path that every node mounts (NFS, EFS): allow it on a "
        "multi-node cluster, where a node-local store is otherwise refused at start.",
    )
    cache_dir: str = Field(
        "var/adapter-cache",
        description="Node-local dir where engine replicas keep fetched adapters; may name "
        "environment variables ($VAR, ~), expanded on each node.",
    )
    cache_max_bytes: Optional[int] = Field(
        8 << 30, gt=0,
        description="Bytes of fetched adapters an Engine replica keeps in cache_dir: past it, after each fetch, "
        "the least recently used versions vLLM no longer holds and no request runs with are removed from the "
        "disk (fetched again on their next use). Never one in use. null: keep every fetched version until it "
        "is deleted.",
    )
    store_timeout_s: float = Field(
        20.0, gt=0,
        description="Seconds one call to the store (a check, one file's upload or download) may take; past it "
        "the request that needed it gets 503 + Retry-After naming the store. Above your largest adapter's download.",
    )
    max_upload_bytes: int = Field(512 << 20, gt=0, description="Bigger uploads get 413.")
    max_unpacked_bytes: int = Field(1 << 30, gt=0, description="Bigger unpacked archives get 413.")
    max_files: int = Field(32, gt=0, description="Archives with more files are refused.")
    max_compression_ratio: float = Field(
        100.0, gt=1,
        description="An archive whose unpacked bytes pass this many times its own size (past "
        "ratio_free_bytes) is refused with 413 as it streams, zip (deflate, bz2, lzma), tar.gz and tgz "
        "alike: trained LoRA weights barely compress (~1.1x), a bomb of zeros 1000x+, so a few KB on the "
        "wire never become a GiB on disk and seconds of CPU.",
    )
    ratio_free_bytes: int = Field(
        16 << 20, ge=0,
        description="Unpacked bytes an archive may reach whatever its compression ratio (small adapters and "
        "configs compress well and are harmless); max_compression_ratio applies beyond them.",
    )
    upload_workers: int = Field(
        2, ge=1,
        description="Threads per ingress replica that unpack, validate and store uploads (and run deletes): "
        "their own pool, so uploads never take the threads adapter resolution and key checks run on.",
    )
    uploads_per_tenant: int = Field(
        1, ge=1,
        description="Uploads (and deletes) of one tenant in progress at once per ingress replica; one more "
        "gets 429 + Retry-After before its body is read. Keep it below upload_workers so no tenant takes "
        "every upload worker.",
    )
    deletion_poll_s: float = Field(
        2.0, gt=0, description="How often engine replicas look for deleted adapters to free."
    )
    cache_salt_per_tenant: bool = Field(
        True, description="Salt each tenant's prefix-cache keys: KV blocks are never shared across tenants."
    )


class DedicatedAdapterConfig(BaseModel):
    """One adapter version served by its own Engine deployment, merged into the base weights."""

    model_config = ConfigDict(extra="forbid")

    adapter: str = Field(
        ..., description="The version as `<tenant id>/<name>@<version>` (e.g. ten_0123456789abcdef/pirate@1): "
        "its requests go to a replica whose base model is this adapter merged into the served model's "
        "weights, while one is healthy; to the LoRA pool otherwise. A version that does not exist (or "
        "was deleted) is skipped at build with a warning: no deployment for it.",
    )
    num_cpus: float = Field(1.0, ge=0, description="Logical CPUs Ray reserves for the dedicated replica.")
    num_gpus: float = Field(0.0, ge=0, description="GPUs for the dedicated replica (tensor_parallel_size on GPUs).")

    @field_validator("adapter")
    @classmethod
    def _version_ref(cls, value: str) -> str:
        tenant, slash, ref = value.partition("/")
        name, at, version = ref.partition("@")
        if not (tenant and slash and name and at and version.isdigit()):
            raise ValueError(f"dedicated adapter {value!r}: write it `<tenant id>/<name>@<version>`, "
                             "a version number (a dedicated replica serves one immutable version)")
        return value

    @property
    def tenant(self) -> str:
        return self.adapter.partition("/")[0]

    @property
    def ref(self) -> str:
        return self.adapter.partition("/")[2]


class DedicatedConfig(BaseModel):
    """Hot adapters on merged dedicated replicas (docs/operations.md#merged-dedicated-replicas)."""

    model_config = ConfigDict(extra="forbid")

    adapters: list[DedicatedAdapterConfig] = Field(
        default_factory=list,
        description="Adapter versions marked dedicated by config. Versions marked with PUT "
        "/admin/tenants/{id}/adapters/{name@version}/dedicated are added to these when the app is "
        "built (each `serve run`, or a `serve deploy` that changes `args`).",
    )
    admin_marks: bool = Field(
        True, description="Also build a dedicated replica for each version marked through the admin "
        "route (read from the database when the app is built); false: the config's list only.")
    num_cpus: float = Field(1.0, ge=0, description="Logical CPUs of an admin-marked version's replica.")
    num_gpus: float = Field(0.0, ge=0, description="GPUs of an admin-marked version's replica.")
    merge_dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="dtype the merged checkpoint is saved in; auto: the engine's dtype, or the "
        "base model's own when that is auto. Keep it the engine's: merging W + BA in a narrower dtype "
        "than the LoRA path computes in changes the output.",
    )
    health_poll_s: float = Field(
        2.0, gt=0, description="How often each ingress replica reads the dedicated deployments' health "
        "(Serve's status) and the admin marks; a mark removed elsewhere stops routing within this.")
    failure_backoff_s: float = Field(
        15.0, ge=0, description="After a call to a dedicated replica fails before its first token (the "
        "replica was lost), its adapter goes to the LoRA pool for this long, whatever Serve's status says.")


class PlatformConfig(BaseModel):
    """The `args:` block of serve_config.yaml."""

    model_config = ConfigDict(extra="forbid")

    database_url: str = Field(
        "sqlite:///var/loraplex.db",
        repr=False,
        description="SQLAlchemy URL of tenants, adapters and usage: a SQLite file (single node) "
        "or postgresql://... (multi-node). Left out of repr(): a postgresql:// URL may hold a password.",
    )
    registry: RegistryConfig = Field(default_factory=RegistryConfig)
    tenancy: TenancyConfig = Field(default_factory=TenancyConfig)
    accounting: AccountingConfig = Field(
        default_factory=AccountingConfig, description="Usage ledger, prices, billing export and cost model."
    )
    slo: SloConfig = Field(
        default_factory=SloConfig,
        description="Service-level objectives and alert thresholds: read by the alert-rule and "
        "dashboard generators (`python -m loraplex.observability`) and, for TTFT/TPOT, by GET "
        "/admin/latency (the console's latency panel); Engine replicas get only the TPOT target, "
        "copied into the fair queue's adaptive dispatch limit (for_replicas).",
    )

    engine: EngineConfig = Field(
        default_factory=EngineConfig,
        description="The one base model's vLLM settings (single-model form); with `models:`, left out: it is "
        "then the first base's, which requests name or the default.")
    engine_deployment: EngineDeploymentConfig = Field(
        default_factory=EngineDeploymentConfig,
        description="The one base model's Engine pool (single-model form); with `models:`, left out.")
    models: list[BaseModelConfig] = Field(
        default_factory=list,
        description="Several base models in one app: each its own Engine pool (deployment `Engine` for the first, "
        "`Engine-<name>` for the others), router and fair queue; tenants' adapters are bound to the base they "
        "were uploaded for. Left out: the one base of `engine` / `engine_deployment`.",
    )
    ingress: IngressDeploymentConfig = Field(default_factory=IngressDeploymentConfig)
    metrics: MetricsConfig = Field(
        default_factory=MetricsConfig,
        description="Per-tenant Prometheus metrics from every replica, exported through Ray's metrics "
        "agent (docs/metrics.md): on/off, the tenant/adapter label bounds, the publish period.",
    )
    console: ConsoleConfig = Field(
        default_factory=ConsoleConfig,
        description="The web console at /console: where its latency panel (GET /admin/latency) reads TTFT/TPOT.",
    )
    batches: BatchConfig = Field(
        default_factory=BatchConfig,
        description="The Batch API (/v1/files, /v1/batches): file and line bounds, the completion window, and "
        "the pace of the runner every Ingress replica runs.",
    )
    dedicated: DedicatedConfig = Field(
        default_factory=DedicatedConfig,
        description="Hot adapter versions served by their own Engine deployment with the adapter merged into "
        "the base weights (base-model speed), falling back to the LoRA pool while it is unhealthy.",
    )

    _allow_none = field_validator("engine", mode="before")(classmethod(_none_as_empty))

    @model_validator(mode="after")
    def _one_list_of_bases(self) -> "PlatformConfig":
        """`models:` or the single-model `engine` / `engine_deployment`, never both (one would be
        ignored); afterwards `models` always lists every base and `engine` / `engine_deployment` are
        the first's (what code that serves one base reads)."""
        if not self.models:
            self.models = [BaseModelConfig(engine=self.engine, engine_deployment=self.engine_deployment)]
            return self
        both = sorted({"engine", "engine_deployment"} & self.model_fields_set)
        first = self.models[0]
        if both and (self.engine, self.engine_deployment) != (first.engine, first.engine_deployment):  # a dump's are equal
            raise ValueError(f"{' and '.join(both)} set beside `models:`: with several bases each entry of `models` "
                             f"has its own; move {both[0]} into the entry of its base")
        seen: dict[str, int] = {}
        for i, base in enumerate(self.models):
            if base.model_id in seen:
                raise ValueError(f"models[{i}] and models[{seen[base.model_id]}] are both named {base.model_id!r}: "
                                 "each base needs its own name (set models[i].name)")
            seen[base.model_id] = i
            pool = pool_deployment_name(i, base.model_id)
            if "#" in pool:
                raise ValueError(f"models[{i}].name {base.model_id!r}: a base's name may not contain '#' "
                                 "(Ray Serve deployment names cannot)")
        self.engine, self.engine_deployment = self.models[0].engine, self.models[0].engine_deployment
        return self

    @model_validator(mode="after")
    def _prices_name_served_bases(self) -> "PlatformConfig":
        """A per-base price for a base this app does not serve would be stored and never charged
        (a misspelt id bills at the plan's prices): refuse it, naming the bases."""
        unknown = _unserved(sorted(self.accounting.pricing.priced_models()), self.base_names)
        if unknown:
            raise ValueError(f"accounting.pricing prices base model(s) {', '.join(unknown)}, which this app does not "
                             f"serve (its bases: {', '.join(self.base_names)}): fix the name under `models:` of the "
                             "plan or override")
        unknown = _unserved(sorted(set(self.accounting.cost_model.models)), self.base_names)
        if unknown:
            raise ValueError(f"accounting.cost_model.models names {', '.join(unknown)}, which this app does not serve "
                             f"(its bases: {', '.join(self.base_names)})")
        return self

    @model_validator(mode="after")
    def _plan_limits_name_known_bases(self) -> "PlatformConfig":
        """A plan's per-base limits on a base that is not served would never apply: a typo or a
        base removed from `models:` is refused at start, not silently unlimited."""
        bases = self.base_names
        for plan, plan_config in self.tenancy.plans.items():
            unknown = _unserved(plan_config.limits.models or {}, bases)
            if unknown:
                raise ValueError(f"tenancy.plans.{plan}.limits.models: unknown base model {unknown[0]!r}; the bases "
                                 f"are {', '.join(bases)}. Name one of them (a base's `name`, else its model "
                                 "dir's name) or remove the entry")
        return self

    @model_validator(mode="after")
    def _shedding_reachable(self) -> "PlatformConfig":
        """With the fair queue on, vLLM holds at most max_num_seqs of a replica's requests: a
        priority-0 count threshold set at or above it would be stored and never act."""
        for i, base in enumerate(self.models):
            shedding, seqs = base.engine_deployment.shedding, base.engine.max_num_seqs
            where = "engine_deployment" if len(self.models) == 1 else f"models[{i}].engine_deployment"
            if (base.engine_deployment.fair_queue.enabled and "shed_requests" in shedding.model_fields_set
                    and shedding.requests_by_priority is None and shedding.shed_requests >= seqs):
                raise ValueError(
                    f"{where}.shedding.shed_requests={shedding.shed_requests} can never be reached: with "
                    f"fair_queue on, vLLM holds at most max_num_seqs={seqs} of a replica's requests and the queue "
                    "holds the rest. Set it below max_num_seqs to refuse priority 0 before the batch is full, or "
                    f"bound the queue with {where}.fair_queue.max_queued instead.")
        return self

    @model_validator(mode="after")
    def _cost_model_follows_the_profile(self) -> "PlatformConfig":
        """An unset cost model prices the hardware the Engine replicas run on: a GPU's hour where they
        have GPUs, a CPU VM's otherwise (a CPU install priced at a GPU's hour reports a cost per
        token thousands of times too high)."""
        on_gpu = any(base.engine_deployment.num_gpus > 0 for base in self.models)
        cost_model = self.accounting.cost_model.for_profile(on_gpu=on_gpu)
        if cost_model is not self.accounting.cost_model:
            self.accounting = self.accounting.model_copy(update={"cost_model": cost_model})
        return self

    def plan_names(self) -> set[str]:
        """The plans a tenant may be put on: those with limits (tenancy.plans) or prices
        (accounting.pricing.plans), and the default."""
        return {DEFAULT_PLAN, *self.tenancy.plans, *self.accounting.pricing.plans}

    @classmethod
    def from_args(cls, args: Optional[dict[str, Any]]) -> "PlatformConfig":
        return cls.model_validate(args or {})

    def bases(self) -> list[BaseModelConfig]:
        """Every base, the first (the default) first. With one base, `engine` / `engine_deployment`
        are it (a copy of the config that updates them updates the base); with several, `models`
        is (`engine` is then the first's, or after for_model() that base's)."""
        if len(self.models) > 1:
            return list(self.models)
        first = self.models[0]
        if first.engine is not self.engine or first.engine_deployment is not self.engine_deployment:
            first = first.model_copy(update={"engine": self.engine, "engine_deployment": self.engine_deployment})
        return [first]

    @property
    def base_names(self) -> list[str]:
        """Every base's name, the first (the default) first."""
        return [base.model_id for base in self.bases()]

    def base(self, name: Optional[str] = None) -> BaseModelConfig:
        """The base named `name` (None: the first). KeyError names the bases there are."""
        for base in self.bases():
            if name is None or base.model_id == name:
                return base
        raise KeyError(f"no base model named {name!r}; the bases are {', '.join(self.base_names)}")

    def pool_name(self, name: Optional[str] = None) -> str:
        """The Engine deployment serving the base named `name` (None: the first)."""
        names = self.base_names
        index = 0 if name is None else names.index(self.base(name).model_id)
        return pool_deployment_name(index, names[index])

    def for_model(self, name: Optional[str]) -> "PlatformConfig":
        """This config as one base's Engine replicas see it: `engine` and `engine_deployment` are that
        base's (`models` still lists all)."""
        base = self.base(name)
        return self.model_copy(update={"engine": base.engine, "engine_deployment": base.engine_deployment})

    def for_replicas(self) -> "PlatformConfig":
        """What replicas are built with: without the replica counts and the SLOs (but for the
        TPOT target of the fair queue's adaptive limit and of the tenant scheduler, copied into
        them), so their init
        args do not differ by them (the Ingress gets the SLO back, for GET /admin/latency:
        loraplex/app.py). (A `serve deploy` of changed
        `args` replaces every replica anyway, since Serve hashes `args` into the app's version:
        scale through `deployments:`, and after an `slo:` change only regenerate the rules.)"""
        models = [self._base_for_replicas(base) for base in self.bases()]
        return self.model_copy(update={
            "models": models, "engine": models[0].engine, "engine_deployment": models[0].engine_deployment,
            "ingress": self.ingress.model_copy(update={"num_replicas": 1}),
            "slo": SloConfig(),
        })

    def _base_for_replicas(self, base: BaseModelConfig) -> BaseModelConfig:
        deployment = base.engine_deployment
        queue = deployment.fair_queue
        # The one `slo:` figure replicas use: the TPOT target of the adaptive dispatch limit...
        adaptive = queue.adaptive.model_copy(update={"tpot_s": queue.adaptive.tpot_s or self.slo.tpot_p95_s})
        # And the tenant scheduler's, which sizes shared steps by it.
        steps = base.engine.tenant_scheduler
        engine = base.engine.model_copy(update={"tenant_scheduler": steps.model_copy(
            update={"tpot_s": steps.tpot_s or self.slo.tpot_p95_s})})
        return base.model_copy(update={"engine": engine, "engine_deployment": deployment.model_copy(update={
            "num_replicas": 1, "autoscaling": None, "fair_queue": queue.model_copy(update={"adaptive": adaptive})})})

    def resolved(self, base_dir: Path) -> "PlatformConfig":
        """Pin every relative local path to base_dir: replicas run in other working dirs."""
        db = self.database_url
        prefix = "sqlite:///"
        if db.startswith(prefix) and not db.startswith(prefix + "/") and db != prefix + ":memory:":
            db = prefix + str((base_dir / db[len(prefix):]).resolve())
        registry = self.registry.model_copy(update={
            "store_url": _local_abs(self.registry.store_url, base_dir),
            "cache_dir": _local_abs(self.registry.cache_dir, base_dir),
        })
        accounting = self.accounting.model_copy(update={
            "spool_dir": _local_abs(self.accounting.spool_dir, base_dir),
        })
        models = [base.model_copy(update={"engine": base.engine.resolved(base_dir)}) for base in self.bases()]
        return self.model_copy(update={
            "models": models, "engine": models[0].engine, "database_url": db, "registry": registry,
            "accounting": accounting,
        })


def pool_deployment_name(index: int, model_id: str) -> str:
    """The Engine deployment of the base at `models[index]`: `Engine` for the first (what a
    single-model config's `deployments:` and dashboards name), `Engine-<name>` for the others."""
    return DEFAULT_POOL if index == 0 else f"{DEFAULT_POOL}-{model_id.replace('/', '-')}"


def _local_abs(path_or_url: str, base_dir: Path) -> str:
    # $VAR and ~ are expanded on each replica's node (loraplex.cluster.for_this_node).
    if "://" in path_or_url or Path(path_or_url).is_absolute() or path_or_url.startswith(("$", "~")):
        return path_or_url
    return str((base_dir / path_or_url).resolve())
