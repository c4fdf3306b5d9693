"""ReplicaMetrics: one replica's own gauges and counters (no per-request labels).

An Engine replica reports its vLLM engine (KV-cache usage, running and waiting requests,
preemptions, prefix-cache queries and hits: vLLM's own numbers, read from its Prometheus
registry by the replica's one EngineStatsReader), its adapters (resident per tier, loads and
their seconds, evictions) and its usage ledger. An Ingress replica reports where its router sent
requests and its own ledger. Serve's `deployment` / `replica` labels tell them apart. An Engine
replica's metrics (catalog.ENGINE_METRICS) also carry `model`, the base model it serves.

vLLM's counters are cumulative in its registry; they are re-exported as counters by adding what
grew since the last publish. Counters with known label values start at 0 (see RaySink.zero).
"""

from __future__ import annotations

from typing import Iterable, Mapping

from loraplex.metrics import catalog as c
from loraplex.metrics.counts import Counts
from loraplex.metrics.fixed_tags import FixedTags

# EngineStatsReader keys -> our per-replica counters and gauges.
_ENGINE_COUNTERS = {"preemptions": c.PREEMPTIONS, "prefix_cache_queries": c.PREFIX_QUERIES,
                    "prefix_cache_hits": c.PREFIX_HITS}
_ENGINE_GAUGES = {"kv_cache_usage": c.KV_USAGE, "num_requests_running": c.RUNNING,
                  "num_requests_waiting": c.WAITING}


class ReplicaMetrics:
    def __init__(self, sink, role: str, base_model: str | None = None):
        """role: "engine" or "ingress": which of the per-replica metrics this replica has.
        base_model: an Engine replica's base model id (engine.model_id), its metrics' `model`."""
        if role == "engine" and not base_model:
            raise ValueError("an engine replica's metrics need its base_model (engine.model_id): their `model` label")
        specs = (c.ENGINE_METRICS if role == "engine" else (c.ROUTING_DECISIONS, c.MIGRATIONS, c.DATABASE_REACHABLE)) + c.LEDGER_METRICS
        model = {c.MODEL: base_model or ""}
        self.metrics = {spec.name: FixedTags(sink.make(spec), model) if c.MODEL in spec.labels else sink.make(spec)
                        for spec in specs}
        self._last: dict[str, float] = {}  # vLLM counter -> its value at the last publish
        self._queue_labels: set[str] = set()  # tenant label values the fair-queue gauges last set
        # Per request, so added up here and handed to Ray by flush() (see Counts).
        self._decisions = (Counts(self.metrics[c.ROUTING_DECISIONS.name], c.ROUTING_DECISIONS.labels)
                           if c.ROUTING_DECISIONS.name in self.metrics else None)
        self._evicted = {r: {c.REASON: r} for r in c.ADAPTER_EVICTIONS.values[c.REASON]}
        for spec in specs:  # counters start at 0, for every known label value
            if spec.kind != "counter":
                continue
            metric = self.metrics[spec.name]
            if spec.values:
                (label, values), = spec.values.items()
                for value in values:
                    metric.zero({label: value})
            elif set(spec.labels) <= {c.MODEL}:  # a label of values known only later: from its first count
                metric.zero()

    # -- Engine ---------------------------------------------------------------------------------
    def engine_stats(self, stats: Mapping[str, float]) -> None:
        """One reading of the EngineStatsReader."""
        for key, spec in _ENGINE_GAUGES.items():
            self.metrics[spec.name].set(float(stats.get(key, 0.0)))
        for key, spec in _ENGINE_COUNTERS.items():
            self._add_growth(key, float(stats.get(key, 0.0)), spec)
        self.metrics[c.LOADED_ADAPTERS.name].set(float(stats.get("lora_running_adapters", 0)), {c.TIER: "gpu"})

    def slo_classes(self, names: Iterable[str]) -> None:
        """The SLO classes this replica's scheduler keeps (those with a TPOT target): their
        unreachable-step counters start at 0, so a query or alert finds each before its first count."""
        for name in names:
            self.metrics[c.UNREACHABLE_STEPS.name].zero({c.SLO_CLASS: name})

    def unreachable_steps(self, by_class: Mapping[str, int]) -> None:
        """The tenant scheduler's cumulative count of unreachable steps per SLO class."""
        for name, value in by_class.items():
            self._add_growth(f"unreachable/{name}", float(value), c.UNREACHABLE_STEPS, {c.SLO_CLASS: name})

    def _add_growth(self, key: str, value: float, spec, tags: dict | None = None) -> None:
        """Re-export an engine's cumulative count as our counter: what grew since the last publish."""
        grown = value - self._last.get(key, 0.0)
        if grown < 0:  # the engine's counters restarted (never within one vLLM engine)
            grown = value
        if grown > 0:
            self.metrics[spec.name].inc(grown, tags)
        self._last[key] = value

    def fair_queue(self, snapshot: Mapping, tenant_label) -> None:
        """The fair queue's snapshot; tenant_label maps a tenant id through the label guard."""
        self.metrics[c.FAIR_QUEUE_LIMIT.name].set(float(snapshot["dispatch_limit"]))
        self.metrics[c.FAIR_QUEUE_DISPATCHED.name].set(float(snapshot["dispatched"]))
        lengths: dict[str, float] = {}
        counters: dict[str, float] = {}
        for tenant, t in snapshot["tenants"].items():
            label = tenant_label(tenant)
            lengths[label] = lengths.get(label, 0.0) + t["queued"]
            counters[label] = max(counters.get(label, 0.0), t["counter"])  # `other`: the highest
        for label in self._queue_labels - set(lengths):  # idle now: back to 0
            lengths[label], counters[label] = 0.0, 0.0
        for label in lengths:
            self.metrics[c.FAIR_QUEUE_LENGTH.name].set(lengths[label], {c.TENANT: label})
            self.metrics[c.FAIR_QUEUE_COUNTER.name].set(counters[label], {c.TENANT: label})
        self._queue_labels = {label for label, n in lengths.items() if n or counters[label]}

    def resident_adapters(self, cpu: int) -> None:
        self.metrics[c.LOADED_ADAPTERS.name].set(float(cpu), {c.TIER: "cpu"})

    def adapter_tier(self, pinned: int, cpu_bytes: int) -> None:
        self.metrics[c.PINNED_ADAPTERS.name].set(float(pinned))
        self.metrics[c.ADAPTER_CPU_BYTES.name].set(float(cpu_bytes))

    def adapter_loaded(self, seconds: float) -> None:
        self.metrics[c.ADAPTER_LOADS.name].inc(1)
        self.metrics[c.ADAPTER_LOAD_SECONDS.name].observe(max(seconds, 0.0))

    def adapters_evicted(self, reason: str, n: int = 1) -> None:
        if n > 0:
            self.metrics[c.ADAPTER_EVICTIONS.name].inc(n, self._evicted[reason])

    # -- Ingress --------------------------------------------------------------------------------
    def routed(self, decision: str) -> None:
        self._decisions.add((decision,))

    def migrated(self, outcome: str) -> None:
        """A request whose replica was lost: what the ingress did (catalog.MIGRATIONS). Rare: no Counts."""
        self.metrics[c.MIGRATIONS.name].inc(1, {c.OUTCOME: outcome})

    def database(self, reachable: bool) -> None:
        self.metrics[c.DATABASE_REACHABLE.name].set(1.0 if reachable else 0.0)

    def flush(self) -> None:
        if self._decisions is not None:
            self._decisions.flush()

    # -- both -----------------------------------------------------------------------------------
    def ledger(self, last_flush_at: float, pending_records: int, unspooled_records: int = 0) -> None:
        self.metrics[c.SPOOL_LAST_FLUSH.name].set(float(last_flush_at))
        self.metrics[c.SPOOL_PENDING.name].set(float(pending_records))
        self.metrics[c.SPOOL_UNSPOOLED.name].set(float(unspooled_records))


class NoReplicaMetrics:
    """metrics.enabled: false."""

    def engine_stats(self, stats) -> None:
        pass

    def resident_adapters(self, cpu) -> None:
        pass

    def adapter_tier(self, pinned, cpu_bytes) -> None:
        pass

    def fair_queue(self, snapshot, tenant_label) -> None:
        pass

    def slo_classes(self, names) -> None:
        pass

    def unreachable_steps(self, by_class) -> None:
        pass

    def adapter_loaded(self, seconds) -> None:
        pass

    def adapters_evicted(self, reason, n=1) -> None:
        pass

    def routed(self, decision) -> None:
        pass

    def migrated(self, outcome) -> None:
        pass

    def database(self, reachable) -> None:
        pass

    def flush(self) -> None:
        pass

    def ledger(self, last_flush_at, pending_records, unspooled_records=0) -> None:
        pass
