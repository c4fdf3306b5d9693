"""vLLM's own Prometheus counters and gauges, read in the replica's process.

The ledger is reconciled against these (tokens the engine says it processed), bench_routing
reads the prefix-cache hit rate from them, and the replica's load shedding, routing stats and
metrics read its load from them: numbers the engine keeps, not ones we count. A replica has one
EngineStatsReader, which all of those share.
"""

from __future__ import annotations

import time

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
# An info gauge: one sample per set of adapters seen, valued at the time it was last set; the
# latest names the adapters of the running batch (those holding LoRA slots).
LORA_INFO = "vllm:lora_requests_info"


def read_engine_counters(registry: CollectorRegistry = REGISTRY) -> dict[str, float]:
    """Each counter summed over its labels (one engine per process: the labels are its model and
    index), each gauge, and `lora_running_adapters`: adapters in the running batch."""
    wanted = {f"{name}_total": key for key, name in COUNTERS.items()}
    wanted.update({name: key for key, name in GAUGES.items()})
    values = dict.fromkeys([*COUNTERS, *GAUGES], 0.0)
    lora_latest, running = float("-inf"), ""
    for family in registry.collect():
        for sample in family.samples:
            key = wanted.get(sample.name)
            if key is not None:
                values[key] += sample.value
            elif sample.name == LORA_INFO and sample.value > lora_latest:
                lora_latest, running = sample.value, sample.labels.get("running_lora_adapters", "")
    values["lora_running_adapters"] = float(len([name for name in running.split(",") if name]))
    return values


class EngineStatsReader:
    """The replica's one reader of vLLM's registry: a reading is reused for `max_age_s`, so the
    shedder (per request), the routing stats and the metrics publisher share it."""

    def __init__(self, max_age_s: float = 0.25, registry: CollectorRegistry = REGISTRY, clock=time.monotonic):
        self.max_age_s = max_age_s
        self.registry = registry
        self.clock = clock
        self._values: dict[str, float] | None = None
        self._read_at = float("-inf")

    def read(self, max_age_s: float | None = None) -> dict[str, float]:
        """The latest reading if younger than max_age_s (default: the reader's), else a new one."""
        now = self.clock()
        if self._values is None or now - self._read_at >= (self.max_age_s if max_age_s is None else max_age_s):
            self._values, self._read_at = read_engine_counters(self.registry), now
        return self._values
