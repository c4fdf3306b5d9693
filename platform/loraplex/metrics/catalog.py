"""Every `loraplex_*` metric: name, type, labels, meaning. The one list docs/metrics.md documents
(a unit test checks they agree) and the recorders register.

Exported through Ray's metrics agent (see docs/metrics.md), every name gets Ray's `ray_` prefix:
`loraplex_prompt_tokens_total` is scraped as `ray_loraplex_prompt_tokens_total`. Ray also adds
`deployment`, `replica`, `application` (Serve's replica labels) and its own process labels
(`WorkerId`, `NodeAddress`, `SessionName`, ...). Label lists below are ours only.
"""

from __future__ import annotations

from dataclasses import dataclass

RAY_PREFIX = "ray_"  # what Ray's metrics agent puts in front of every name it exports

# Label names.
TENANT, ADAPTER, STATUS, REASON, TIER, DECISION = "tenant", "adapter", "status", "reason", "tier", "decision"
OUTCOME, OPERATION, DISK = "outcome", "operation", "disk"
# The request's SLO class (slo.classes: configured names, a handful) and whether it met its targets.
SLO_CLASS, MET = "slo_class", "met"
# The base model id (engine.model_id of the pool that ran it). No cardinality guard: its values are
# the deployment's configured bases, a handful, never a client's input.
MODEL = "model"
# Label values with a meaning of their own (never a tenant id `ten_...` nor an adapter `name@version`).
OTHER = "other"  # a tenant / adapter past the cardinality guard
BASE = "base"  # adapter of a base-model request
UNKNOWN = "-"  # tenant of a request refused before it had one (no or bad key); adapter / model before resolved

# -- Histogram bucket boundaries (seconds), after the OpenTelemetry GenAI semantic conventions.
# OpenTelemetry advises explicit boundaries for `gen_ai.server.time_to_first_token`,
# `gen_ai.server.time_per_output_token` and `gen_ai.server.request.duration`. We keep its
# boundaries from 10 ms up (nothing this platform measures from the ingress is faster), and extend
# them where a loaded CPU replica or a long generation goes past them, so P50/P95/P99 stay inside
# a finite bucket from 10 ms to 60 s (TPOT to 10 s): a quantile that falls in +Inf is only "above
# the last bound".
#
# OpenTelemetry's advice, as published in the GenAI metrics conventions.
OTEL_TIME_TO_FIRST_TOKEN = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                            5.0, 7.5, 10.0)
OTEL_TIME_PER_OUTPUT_TOKEN = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
OTEL_REQUEST_DURATION = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96,
                         81.92)

# TTFT: OTel's from 10 ms, then on to 60 s (a queued request on a busy replica).
TIME_TO_FIRST_TOKEN = tuple(b for b in OTEL_TIME_TO_FIRST_TOKEN if b >= 0.01) + (15.0, 20.0, 30.0, 45.0, 60.0)
# TPOT: OTel's, then 5 and 10 s (an overloaded CPU replica).
TIME_PER_OUTPUT_TOKEN = OTEL_TIME_PER_OUTPUT_TOKEN + (5.0, 10.0)
# End-to-end and queue time: OTel's request-duration doubling, two more steps to cover the
# ingress's default 300 s deadline.
REQUEST_DURATION = OTEL_REQUEST_DURATION + (163.84, 327.68)
QUEUE_TIME = REQUEST_DURATION
# Adapter loads: a local cache hit (ms) to a download from object storage (a minute).
ADAPTER_LOAD = OTEL_REQUEST_DURATION


@dataclass(frozen=True)
class MetricSpec:
    name: str  # the Prometheus name as documented (counters end in _total), without Ray's prefix
    kind: str  # counter | gauge | histogram
    labels: tuple[str, ...]
    help: str
    buckets: tuple[float, ...] = ()
    values: dict[str, tuple[str, ...]] | None = None  # known values of a label, zeroed at start

    @property
    def register_as(self) -> str:
        """The name given to ray.util.metrics: Ray appends `_total` to counters itself."""
        return self.name[:-len("_total")] if self.kind == "counter" else self.name

    @property
    def exported(self) -> str:
        """The name a Prometheus scrape of Ray's metrics agent shows."""
        return RAY_PREFIX + self.name


# Who and what: the tenant, its adapter, the base model that served it.
REQUEST_LABELS = (TENANT, ADAPTER, MODEL)

# -- per request, by tenant, adapter and base model (Engine replicas; the ingress for a replica lost mid-request)
TTFT = MetricSpec(
    "loraplex_time_to_first_token_seconds", "histogram", REQUEST_LABELS,
    "Seconds from the request's arrival at the ingress to its first generated token (the usage record's ttft).",
    TIME_TO_FIRST_TOKEN)
TPOT = MetricSpec(
    "loraplex_time_per_output_token_seconds", "histogram", REQUEST_LABELS,
    "Seconds per output token after the first: (finish - first token) / (tokens of the longest choice - 1).",
    TIME_PER_OUTPUT_TOKEN)
E2E = MetricSpec(
    "loraplex_e2e_request_latency_seconds", "histogram", REQUEST_LABELS,
    "Seconds from the request's arrival at the ingress until the engine finished it, however it ended.",
    REQUEST_DURATION)
QUEUE = MetricSpec(
    "loraplex_queue_time_seconds", "histogram", REQUEST_LABELS,
    "Seconds from the request's arrival at the ingress until vLLM first scheduled it (admission, routing, "
    "Serve's queue, vLLM's waiting queue).",
    QUEUE_TIME)
PROMPT_TOKENS = MetricSpec(
    "loraplex_prompt_tokens_total", "counter", REQUEST_LABELS,
    "Prompt tokens the engine processed, as billed (the usage records' prompt_tokens).")
CACHED_PROMPT_TOKENS = MetricSpec(
    "loraplex_cached_prompt_tokens_total", "counter", REQUEST_LABELS,
    "Of the prompt tokens, those served from the prefix cache (the usage records' cached_prompt_tokens).")
COMPLETION_TOKENS = MetricSpec(
    "loraplex_completion_tokens_total", "counter", REQUEST_LABELS,
    "Tokens generated, as billed (the usage records' completion_tokens).")
REQUESTS = MetricSpec(
    "loraplex_requests_total", "counter", REQUEST_LABELS + (STATUS,),
    "Requests that reached an engine (one per usage record), by how they ended: ok, length, "
    "client_disconnect, timeout, error.")
REFUSALS = MetricSpec(
    "loraplex_refusals_total", "counter", REQUEST_LABELS + (REASON,),
    "Requests refused before generating, never billed, by the reason the ledger counts them under: the "
    "HTTP status, with the limit for 429 (429:rate_limit_requests, ...) and the cause for 503 "
    "(503:shed, 503:fair_share, 503:queue_deadline, 503:queue_full, 503:limiter_unavailable). Counted by the ingress, also for refusals "
    "made by an Engine replica (shedding, adapter deleted).")

SLO_REQUESTS = MetricSpec(
    "loraplex_slo_requests_total", "counter", (TENANT, SLO_CLASS, MET),
    "Requests of a tenant with an SLO class that reached an engine, by whether they were within their "
    "class's TTFT and TPOT targets (met=true; an error or timeout is false): attainment per class and tenant.",
    values={MET: ("true", "false")})
GOODPUT_TOKENS = MetricSpec(
    "loraplex_slo_goodput_tokens_total", "counter", (TENANT, SLO_CLASS),
    "Tokens generated by requests within their class's targets: its rate is goodput, the headline figure.")

# -- per Engine replica, each labelled with the replica's base model (`model`)
UNREACHABLE_STEPS = MetricSpec(
    "loraplex_slo_unreachable_steps_total", "counter", (SLO_CLASS, MODEL),
    "Shared steps whose tightest class's TPOT target was out of reach: one decode (and the least prompt work, "
    "while prompts wait) would overrun it (tenant_scheduler.slo_classes on; from 0 for each class with a TPOT "
    "target): the class's TPOT cannot be met on this engine then, at any batch size.")
KV_USAGE = MetricSpec(
    "loraplex_kv_cache_usage_ratio", "gauge", (MODEL,),
    "Fraction of the replica's KV cache in use (vLLM's kv_cache_usage_perc); over 0.9 preemption is near.")
RUNNING = MetricSpec(
    "loraplex_num_requests_running", "gauge", (MODEL,), "Requests in the replica's vLLM batch.")
WAITING = MetricSpec(
    "loraplex_num_requests_waiting", "gauge", (MODEL,),
    "Requests queued in the replica's vLLM (no batch slot or KV blocks yet).")
LOADED_ADAPTERS = MetricSpec(
    "loraplex_loaded_adapters", "gauge", (TIER, MODEL),
    "Adapters resident on the replica: tier=cpu, in vLLM's host-memory LoRA cache (max_cpu_loras); "
    "tier=gpu, in the running batch's LoRA slots (max_loras).",
    values={TIER: ("cpu", "gpu")})
PREEMPTIONS = MetricSpec(
    "loraplex_preemptions_total", "counter", (MODEL,), "Requests vLLM preempted on the replica (KV cache full).")
PREFIX_QUERIES = MetricSpec(
    "loraplex_prefix_cache_queries_total", "counter", (MODEL,),
    "Prompt tokens the replica looked up in its prefix cache (vLLM's own counter).")
PREFIX_HITS = MetricSpec(
    "loraplex_prefix_cache_hits_total", "counter", (MODEL,),
    "Of those, tokens found in the prefix cache (vLLM's own counter).")
ADAPTER_LOADS = MetricSpec(
    "loraplex_adapter_loads_total", "counter", (MODEL,),
    "Adapter versions the replica loaded: fetched from the adapter store and loaded into vLLM's host "
    "cache, on first use or first use after an eviction.")
ADAPTER_LOAD_SECONDS = MetricSpec(
    "loraplex_adapter_load_seconds", "histogram", (MODEL,),
    "Seconds one adapter load took (fetch + vLLM add_lora); the request waiting for it waits as long.",
    ADAPTER_LOAD)
ADAPTER_EVICTIONS = MetricSpec(
    "loraplex_adapter_evictions_total", "counter", (REASON, MODEL),
    "Adapters that left the replica: reason=lru, evicted from vLLM's host cache to make room "
    "(sampled every publish period); reason=bytes, removed so the CPU tier fits "
    "engine.max_cpu_lora_bytes; reason=deleted, freed after its DELETE.",
    values={REASON: ("lru", "bytes", "deleted")})
PINNED_ADAPTERS = MetricSpec(
    "loraplex_pinned_adapters", "gauge", (MODEL,),
    "Adapter versions pinned in the replica's CPU tier (never evicted; POST /admin/tenants/{id}/adapters/{ref}/pin).")
ADAPTER_CPU_BYTES = MetricSpec(
    "loraplex_adapter_cpu_bytes", "gauge", (MODEL,),
    "Bytes of adapter weights in the replica's CPU tier (host memory); engine.max_cpu_lora_bytes bounds it.")

FAIR_QUEUE_LIMIT = MetricSpec(
    "loraplex_fair_queue_dispatch_limit", "gauge", (MODEL,),
    "Requests the replica's fair queue lets into vLLM at once (fixed, or adapted to the SLO).")
FAIR_QUEUE_DISPATCHED = MetricSpec(
    "loraplex_fair_queue_dispatched", "gauge", (MODEL,), "Sequences (n x prompts of each request) the fair queue has in vLLM now.")
FAIR_QUEUE_LENGTH = MetricSpec(
    "loraplex_fair_queue_length", "gauge", (TENANT, MODEL), "Requests of the tenant waiting in the replica's fair queue.")
FAIR_QUEUE_COUNTER = MetricSpec(
    "loraplex_fair_queue_virtual_counter", "gauge", (TENANT, MODEL),
    "The tenant's virtual token counter on the replica (weighted tokens served / plan weight): "
    "the lowest backlogged one is served next.")

# -- per Ingress replica
ROUTING_DECISIONS = MetricSpec(
    "loraplex_routing_decisions_total", "counter", (DECISION,),
    "Where the router sent a generation request: affinity (a replica holding its tenant/adapter key), "
    "new_key (no replica held the key), spill (holders were over the load bound, another took it), "
    "ranked (a policy that tracks no holders), fallback (Serve's power of two: no key, or the policy failed).",
    values={DECISION: ("affinity", "new_key", "spill", "ranked", "fallback")})

MIGRATIONS = MetricSpec(
    "loraplex_request_migrations_total", "counter", (OUTCOME,),
    "Generation requests whose Engine replica was lost mid-request (ingress/migration.py), by what the "
    "ingress did: continued (a stream went on from the text its client had, on another replica), resent "
    "(nothing was delivered: the whole request again), not_continuable (the reply cannot be continued "
    "exactly: it ended with the error event), exhausted (ingress.max_migrations or the deadline reached).",
    values={OUTCOME: ("continued", "resent", "not_continuable", "exhausted")})

DATABASE_REACHABLE = MetricSpec(
    "loraplex_database_reachable", "gauge", (),
    "1 while the replica's last query (its key-cache refresh every tenancy.key_cache.refresh_s / 2, or a "
    "request's) reached the database; 0 during an outage: cached keys are served, the rest answers 503.")

# -- per limiter actor (tenancy.limiter; no Serve labels)
BUDGET_SOURCE_FAILURES = MetricSpec(
    "loraplex_budget_source_failures_total", "counter", (),
    "Reads of a tenant's month-to-date usage for monthly_token_budget that failed (the database could not "
    "be reached). Meanwhile tenancy.limiter.on_unavailable decides: open admits on the last read, closed "
    "refuses budgeted tenants with 503.")

# -- per replica that reads or writes the adapter store (Engine and Ingress)
ADAPTER_STORE_FAILURES = MetricSpec(
    "loraplex_adapter_store_failures_total", "counter", (OPERATION,),
    "Calls to the adapter store (registry.store_url: adapter weights, Batch API files) that failed or took over "
    "registry.store_timeout_s, by operation (read, write, delete); each answered its request 503 + Retry-After.",
    values={OPERATION: ("read", "write", "delete")})

# -- per replica that writes a node-local disk (Engine: spool, adapter cache; Ingress: spool, uploads)
DISK_WRITE_FAILURES = MetricSpec(
    "loraplex_disk_write_failures_total", "counter", (DISK,),
    "Writes to a node-local disk that failed, by disk: usage_spool (accounting.spool_dir: full or failing; the "
    "record is held in memory and written into the database), adapter_cache (registry.cache_dir full: idle "
    "copies pruned, the fetch retried once, else 503 adapter_cache_full), upload_temp (the temp dir full: the "
    "upload answered 503 upload_temp_full).",
    values={DISK: ("usage_spool", "adapter_cache", "upload_temp")})

# -- per replica with a usage ledger (Engine and Ingress)
SPOOL_LAST_FLUSH = MetricSpec(
    "loraplex_usage_last_flush_timestamp_seconds", "gauge", (),
    "Unix time of the replica's last successful usage-ledger flush into the database (0: none yet).")
SPOOL_PENDING = MetricSpec(
    "loraplex_usage_spool_pending_records", "gauge", (),
    "Usage records the replica spooled that are not in the database yet.")
SPOOL_UNSPOOLED = MetricSpec(
    "loraplex_usage_unspooled_records", "gauge", (),
    "Usage records the replica's spool refused (disk full or failing), held in memory until the spool or the "
    "database takes them; at accounting.max_unspooled_records the Engine replica refuses new requests (503 "
    "usage_spool_full).")

REQUEST_METRICS = (TTFT, TPOT, E2E, QUEUE, PROMPT_TOKENS, CACHED_PROMPT_TOKENS, COMPLETION_TOKENS, REQUESTS)
SLO_METRICS = (SLO_REQUESTS, GOODPUT_TOKENS)  # per request too, only those with an SLO class
ENGINE_METRICS = (KV_USAGE, RUNNING, WAITING, LOADED_ADAPTERS, PREEMPTIONS, PREFIX_QUERIES, PREFIX_HITS,
                  ADAPTER_LOADS, ADAPTER_LOAD_SECONDS, ADAPTER_EVICTIONS,
                  FAIR_QUEUE_LIMIT, FAIR_QUEUE_DISPATCHED, FAIR_QUEUE_LENGTH, FAIR_QUEUE_COUNTER,
                  PINNED_ADAPTERS, ADAPTER_CPU_BYTES, UNREACHABLE_STEPS)
INGRESS_METRICS = (REFUSALS, ROUTING_DECISIONS, MIGRATIONS, DATABASE_REACHABLE)
LIMITER_METRICS = (BUDGET_SOURCE_FAILURES,)
LEDGER_METRICS = (SPOOL_LAST_FLUSH, SPOOL_PENDING, SPOOL_UNSPOOLED)
STORE_METRICS = (ADAPTER_STORE_FAILURES, DISK_WRITE_FAILURES)
ALL = REQUEST_METRICS + SLO_METRICS + ENGINE_METRICS + INGRESS_METRICS + LIMITER_METRICS + LEDGER_METRICS + STORE_METRICS
