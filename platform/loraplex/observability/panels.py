"""The dashboard's panels and their PromQL (from promql.py): what an operator looks at.
dashboard.py lays them out as Grafana JSON; panel_data.py checks each returns data."""
from dataclasses import dataclass, field
from functools import partial

from loraplex.observability import names as n
from loraplex.observability import promql as q
from loraplex.observability.rules import COST_RECORD
from loraplex.observability.served import ServedPlatform

RATE = "$__rate_interval"   # Grafana: a rate window of at least four scrapes
RANGE = "$__range"          # Grafana: the dashboard's time range
GRAFANA_UNITS = {"USD": "currencyUSD", "EUR": "currencyEUR", "GBP": "currencyGBP", "JPY": "currencyJPY"}


@dataclass(frozen=True)
class Target:
    expr: str
    legend: str
    reference: bool = False   # a flat line (SLO, alert threshold): drawn dashed


@dataclass(frozen=True)
class Panel:
    title: str
    description: str
    targets: tuple[Target, ...]
    unit: str = "short"
    table: bool = False       # instant values per tenant in a table instead of a time series


@dataclass(frozen=True)
class Row:
    title: str
    panels: tuple[Panel, ...] = field(default_factory=tuple)


def _percentiles(histogram: str, *extra: Target) -> tuple[Target, ...]:
    return tuple(Target(q.quantile(p, histogram, RATE), f"P{round(p * 100)}") for p in (0.5, 0.95, 0.99)) + extra


def _ref(value: float, legend: str) -> Target:
    return Target(q.constant(value), legend, reference=True)


def latency(served: ServedPlatform) -> Row:
    slo = served.config.slo
    return Row("Latency against the SLO", (
        Panel("Time to first token", "P50 / P95 / P99 over all tenants; the SLO is on P95.",
              _percentiles(n.TTFT, _ref(slo.ttft_p95_s, "SLO (P95)")), "s"),
        Panel("Time per output token", "Decode pace, P50 / P95 / P99; the SLO is on P95.",
              _percentiles(n.TPOT, _ref(slo.tpot_p95_s, "SLO (P95)")), "s"),
        Panel("TTFT P95 by tenant", "Which tenants wait longest for their first token.",
              (Target(q.quantile(0.95, n.TTFT, RATE, [n.TENANT]), "{{tenant}}"), _ref(slo.ttft_p95_s, "SLO (P95)")), "s"),
        Panel("End-to-end and queue time", "Request latency from arrival to last token, and time waiting "
              "in an engine's queue before its first step (P50 / P95).",
              (Target(q.quantile(0.5, n.E2E, RATE), "end-to-end P50"), Target(q.quantile(0.95, n.E2E, RATE), "end-to-end P95"),
               Target(q.quantile(0.5, n.QUEUE, RATE), "queue P50"), Target(q.quantile(0.95, n.QUEUE, RATE), "queue P95")), "s"),
    ))


def traffic(served: ServedPlatform) -> Row:
    slo = served.config.slo
    return Row("Traffic, errors and sheds", (
        Panel("Tokens/s in and out", "Prompt tokens (of which served from the prefix cache) and completion tokens.",
              (Target(q.per_second(n.PROMPT_TOKENS, RATE), "in: prompt"),
               Target(q.per_second(n.CACHED_PROMPT_TOKENS, RATE), "in: of which cached"),
               Target(q.per_second(n.COMPLETION_TOKENS, RATE), "out: completion"))),
        Panel("Requests/s by outcome", "Requests that reached an engine, by how they ended; refusals before "
              "the engine (never billed), by reason.",
              (Target(q.per_second(n.REQUESTS, RATE, [n.STATUS]), "{{status}}"),
               Target(q.per_second(n.REFUSALS, RATE, [n.REASON]), "refused {{reason}}")), "reqps"),
        Panel("Availability", "Share of requests neither failed nor shed, against the objective.",
              (Target(q.availability(RATE), "availability"), _ref(slo.availability, "objective")), "percentunit"),
        Panel("Error and shed ratios", "Errors + timeouts among engine requests; 503 refusals among requests.",
              (Target(q.error_ratio(RATE), "errors"), Target(q.shed_ratio(RATE), "shed"),
               _ref(slo.error_rate, "error alert"), _ref(slo.shed_rate, "shed alert")), "percentunit"),
    ))


def replicas(served: ServedPlatform) -> Row:
    slo, app = served.config.slo, served.application
    return Row("Replicas", (
        Panel("Running and waiting requests per engine replica", "vLLM's batch and its queue.",
              (Target(q.per_replica(n.RUNNING), "{{replica}} running"),
               Target(q.per_replica(n.WAITING), "{{replica}} waiting"))),
        Panel("KV-cache usage per engine replica", "Over the alert line for long, preemptions follow.",
              (Target(q.per_replica(n.KV_USAGE), "{{replica}}"), _ref(slo.kv_usage_alert, "alert")), "percentunit"),
        Panel("Prefix-cache hit rate", "Share of prompt tokens found in the prefix cache.",
              (Target(q.prefix_hit_ratio(RATE), "all"),
               Target(q.prefix_hit_ratio(RATE, [n.REPLICA]), "{{replica}}")), "percentunit"),
        Panel("Preemptions/s per engine replica", "Requests vLLM evicted from the batch for KV room.",
              (Target(q.per_second(n.PREEMPTIONS, RATE, [n.REPLICA]), "{{replica}}"),)),
        Panel("Routing decisions/s", "Where the ingress routers sent requests: affinity (a replica holding the "
              "tenant's key), new_key, spill (holders over the load bound), ranked, fallback (power of two).",
              (Target(q.per_second(n.ROUTING_DECISIONS, RATE, [n.DECISION]), "{{decision}}"),)),
        Panel("Healthy replicas", "Ray Serve's healthy replicas per deployment, against the configured count.",
              tuple(Target(q.healthy_replicas(app, d), d) for d in served.deployments())
              + tuple(_ref(want, f"{d} configured") for d, want in served.deployments().items())),
        Panel("Usage spool", "Seconds since each replica last copied its usage records into the database.",
              (Target(q.spool_age(), "{{replica}}"), _ref(slo.spool_flush_max_age_s, "alert")), "s"),
        Panel("Usage records waiting in the spool", "Spooled, not yet in the database, per replica.",
              (Target(q.per_replica(n.SPOOL_PENDING), "{{replica}}"),)),
    ))


def adapters(served: ServedPlatform) -> Row:
    return Row("Adapters", (
        Panel("Adapter loads/s per engine replica", "Loads into an engine (a first request, or after eviction).",
              (Target(q.per_second(n.ADAPTER_LOADS, RATE, [n.REPLICA]), "{{replica}}"),)),
        Panel("Adapter load time", "P50 / P95 of loading an adapter version into an engine.",
              (Target(q.quantile(0.5, n.ADAPTER_LOAD, RATE), "P50"), Target(q.quantile(0.95, n.ADAPTER_LOAD, RATE), "P95")), "s"),
        Panel("Adapters resident per engine replica", "Adapter versions an engine holds: tier cpu in vLLM's "
              "host cache (max_cpu_loras), tier gpu in the batch's LoRA slots (max_loras).",
              (Target(f"max by ({n.REPLICA}, {n.TIER}) ({n.LOADED_ADAPTERS})", "{{replica}} {{tier}}"),)),
        Panel("Adapter evictions/s per engine replica", "lru: pushed out of the host cache to make room "
              "(churn: more adapters in use than max_cpu_loras); deleted: freed after a DELETE.",
              (Target(q.per_second(n.ADAPTER_EVICTIONS, RATE, [n.REPLICA, n.REASON]), "{{replica}} {{reason}}"),)),
    ))


def tenants(served: ServedPlatform) -> Row:
    pricing = served.config.accounting.pricing
    unit = GRAFANA_UNITS.get(pricing.currency, "short")
    price_note = (f"At list prices in {pricing.currency} (the default plan `{pricing.default_plan}`, or a tenant's "
                  "override; each base model at its own where the price names it); a tenant on another plan shows at the "
                  "default plan's price. The bill is "
                  "`loraplex billing statement`.")
    return Row("Tenants", (
        Panel("Prompt tokens/s per tenant", "The 20 busiest.",
              (Target(f"topk(20, {q.per_second(n.PROMPT_TOKENS, RATE, [n.TENANT])})", "{{tenant}}"),)),
        Panel("Completion tokens/s per tenant", "The 20 busiest.",
              (Target(f"topk(20, {q.per_second(n.COMPLETION_TOKENS, RATE, [n.TENANT])})", "{{tenant}}"),)),
        Panel("Refusals/s per tenant", "Requests refused before generating (never billed), by tenant and reason: "
              "429s are the tenant's own limits, 503s are capacity.",
              (Target(f"topk(20, {q.per_second(n.REFUSALS, RATE, [n.TENANT, n.REASON])})", "{{tenant}} {{reason}}"),)),
        Panel(f"Cost per hour per tenant ({pricing.currency})", price_note + " From the recording rule " + COST_RECORD + ".",
              (Target(f"3600 * sum by ({n.TENANT}) ({COST_RECORD})", "{{tenant}}"),), unit),
        Panel(f"Tokens and cost per tenant over the range ({pricing.currency})", price_note,
              (Target(q.increase(n.PROMPT_TOKENS, RANGE, [n.TENANT]), "prompt tokens"),
               Target(q.increase(n.CACHED_PROMPT_TOKENS, RANGE, [n.TENANT]), "cached prompt tokens"),
               Target(q.increase(n.COMPLETION_TOKENS, RANGE, [n.TENANT]), "completion tokens"),
               Target(q.tenant_cost(pricing, partial(q.increase, window=RANGE)), "cost")), unit, table=True),
    ))


def dashboard_rows(served: ServedPlatform) -> list[Row]:
    return [latency(served), traffic(served), replicas(served), adapters(served), tenants(served)]
