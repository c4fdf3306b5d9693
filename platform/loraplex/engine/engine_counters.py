"""vLLM's own Prometheus counters, read in the replica's process.

The ledger is reconciled against these (tokens the engine says it processed) and bench_routing
reads the prefix-cache hit rate from them: numbers the engine keeps, not ones we count.
"""

from __future__ import annotations

from prometheus_client import REGISTRY, CollectorRegistry

COUNTERS = {
    "prompt_tokens": "vllm:prompt_tokens",
    "generation_tokens": "vllm:generation_tokens",
    "prompt_tokens_cached": "vllm:prompt_tokens_cached",
    "prefix_cache_queries": "vllm:prefix_cache_queries",
    "prefix_cache_hits": "vllm:prefix_cache_hits",
    "preemptions": "vllm:num_preemptions",
}
GAUGES = {
    "num_requests_running": "vllm:num_requests_running",
    "num_requests_waiting": "vllm:num_requests_waiting",
    "kv_cache_usage": "vllm:kv_cache_usage_perc",
}


def read_engine_counters(registry: CollectorRegistry = REGISTRY) -> dict[str, float]:
    """Each counter summed over its labels (one engine per process: the labels are its model and index)."""
    wanted = {f"{name}_total": key for key, name in COUNTERS.items()}
    wanted.update({name: key for key, name in GAUGES.items()})
    values = dict.fromkeys([*COUNTERS, *GAUGES], 0.0)
    for family in registry.collect():
        for sample in family.samples:
            key = wanted.get(sample.name)
            if key is not None:
                values[key] += sample.value
    return values
