"""The metric and label names the rules and the dashboard read: a rename is one edit here.

The platform's `loraplex_*` metrics (docs/metrics.md) reach Prometheus through Ray's metrics
export, which puts `ray_` in front of every name (EXPORT_PREFIX); Ray Serve adds the labels
`application`, `deployment` and `replica`. Plus Ray Serve's own replica-health gauge.
"""

EXPORT_PREFIX = "ray_"


def _m(name: str) -> str:
    return EXPORT_PREFIX + name


# Histograms (seconds), labels tenant, adapter.
TTFT = _m("loraplex_time_to_first_token_seconds")
TPOT = _m("loraplex_time_per_output_token_seconds")
E2E = _m("loraplex_e2e_request_latency_seconds")
QUEUE = _m("loraplex_queue_time_seconds")
ADAPTER_LOAD = _m("loraplex_adapter_load_seconds")            # per Engine replica, no tenant

# Counters by tenant, adapter.
PROMPT_TOKENS = _m("loraplex_prompt_tokens_total")
CACHED_PROMPT_TOKENS = _m("loraplex_cached_prompt_tokens_total")
COMPLETION_TOKENS = _m("loraplex_completion_tokens_total")
REQUESTS = _m("loraplex_requests_total")          # + status: requests that reached an engine
REFUSALS = _m("loraplex_refusals_total")          # + reason: refused before generating, never billed
SLO_REQUESTS = _m("loraplex_slo_requests_total")  # tenant, slo_class, met: within the class's targets or not
GOODPUT_TOKENS = _m("loraplex_slo_goodput_tokens_total")  # tenant, slo_class: tokens of requests within them
SLO_CLASS, MET = "slo_class", "met"

# Per Engine replica (the spool gauges: per Engine and Ingress replica).
KV_USAGE = _m("loraplex_kv_cache_usage_ratio")
RUNNING = _m("loraplex_num_requests_running")
WAITING = _m("loraplex_num_requests_waiting")
LOADED_ADAPTERS = _m("loraplex_loaded_adapters")            # + tier: cpu (host cache), gpu (batch slots)
PREEMPTIONS = _m("loraplex_preemptions_total")
ADAPTER_LOADS = _m("loraplex_adapter_loads_total")
ADAPTER_EVICTIONS = _m("loraplex_adapter_evictions_total")  # + reason: lru, deleted
PREFIX_QUERIES = _m("loraplex_prefix_cache_queries_total")  # prompt tokens looked up in the prefix cache
PREFIX_HITS = _m("loraplex_prefix_cache_hits_total")        # of which found
SPOOL_LAST_FLUSH = _m("loraplex_usage_last_flush_timestamp_seconds")  # unix time of the last good flush, 0: none
SPOOL_PENDING = _m("loraplex_usage_spool_pending_records")  # records spooled, not yet in the database
SPOOL_UNSPOOLED = _m("loraplex_usage_unspooled_records")  # records the spool refused, held in memory

# Per Ingress replica.
ROUTING_DECISIONS = _m("loraplex_routing_decisions_total")  # + decision: affinity, new_key, spill, ranked, fallback
DATABASE_REACHABLE = _m("loraplex_database_reachable")  # 1 / 0: the replica's last query reached the database

# Per limiter actor.
BUDGET_SOURCE_FAILURES = _m("loraplex_budget_source_failures_total")  # month-to-date usage reads that failed

# Per replica that reads or writes the adapter store.
ADAPTER_STORE_FAILURES = _m("loraplex_adapter_store_failures_total")  # + operation: read, write, delete

# Per replica that writes a node-local disk.
DISK_WRITE_FAILURES = _m("loraplex_disk_write_failures_total")  # + disk: usage_spool, adapter_cache, upload_temp

# Ray Serve's own (the controller's), always `ray_`-prefixed: healthy replicas per deployment.
SERVE_REPLICA_HEALTHY = "ray_serve_deployment_replica_healthy"

# Labels.
TENANT = "tenant"
MODEL = "model"  # the base model id (metrics.catalog.MODEL)
REPLICA = "replica"
STATUS = "status"
REASON = "reason"
TIER = "tier"
DECISION = "decision"
OPERATION = "operation"

# Label values, as regular expressions.
ERROR_STATUSES = "error|timeout"   # of ok, length, client_disconnect, timeout, error: failed us
# Every 503 refusal is ours: overload (503:shed, 503:queue_full, ...) and our own stores or disks failing
# (503:store_unavailable, 503:adapter_store_unavailable, 503:usage_spool_full, 503:adapter_cache_full,
# 503:upload_temp_full); a tenant's own limits are 429s. All count against availability.
SHED_REASONS = "503.*"

# Scrape jobs of the generated Prometheus config (loraplex.observability.scrape_config).
RAY_JOB = "ray"
STATIC_JOB = "loraplex"
