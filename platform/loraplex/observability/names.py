"""The metric and label names the rules and the dashboard read: a rename is one edit here.

The platform's own metrics (`loraplex_*`, docs/metrics.md) plus Ray Serve's replica health
gauge. Exported through Ray's metrics agent, a name may carry Ray's `ray_` prefix: set PREFIX.
"""

PREFIX = "loraplex_"


def _m(name: str) -> str:
    return PREFIX + name


# Histograms (seconds), labels tenant, adapter.
TTFT = _m("time_to_first_token_seconds")
TPOT = _m("time_per_output_token_seconds")
E2E = _m("e2e_request_latency_seconds")
QUEUE = _m("queue_time_seconds")
ADAPTER_LOAD = _m("adapter_load_seconds")           # per replica

# Counters by tenant, adapter.
PROMPT_TOKENS = _m("prompt_tokens_total")
CACHED_PROMPT_TOKENS = _m("cached_prompt_tokens_total")
COMPLETION_TOKENS = _m("completion_tokens_total")
REQUESTS = _m("requests_total")                      # + status: requests that reached an engine
REFUSALS = _m("refusals_total")                      # + reason: refused before the engine, never billed

# Per replica.
KV_USAGE = _m("kv_cache_usage_ratio")
RUNNING = _m("num_requests_running")
WAITING = _m("num_requests_waiting")
LOADED_ADAPTERS = _m("loaded_adapters")
PREEMPTIONS = _m("preemptions_total")
ADAPTER_LOADS = _m("adapter_loads_total")
PREFIX_QUERIES = _m("prefix_cache_queries_total")   # prompt tokens looked up in the prefix cache
PREFIX_HITS = _m("prefix_cache_hits_total")         # of which found
SPOOL_LAST_FLUSH = _m("usage_last_flush_timestamp_seconds")  # unix time of the last good flush
SPOOL_PENDING = _m("usage_spool_pending_records")   # records spooled, not yet in the database

# Ray Serve's own (the controller's), always `ray_`-prefixed: healthy replicas per deployment.
SERVE_REPLICA_HEALTHY = "ray_serve_deployment_replica_healthy"

# Labels.
TENANT = "tenant"
REPLICA = "replica"
STATUS = "status"
REASON = "reason"

# Label values, as regular expressions.
ERROR_STATUSES = "error|engine_error|timeout"   # a request that reached the engine and failed us
SHED_REASONS = "503.*"                          # refused for capacity: shed, queue full, limiter down

# Scrape jobs of the generated Prometheus config (loraplex.observability.scrape_config).
RAY_JOB = "ray"
STATIC_JOB = "loraplex"
