"""Prometheus metrics `loraplex_*` from every Engine and Ingress replica (docs/metrics.md).

catalog (every metric: name, type, labels), buckets (histogram bounds after OpenTelemetry's GenAI
conventions), label_guard (the tenant/adapter cardinality guard), outcomes (ledger status ->
`status`), request_metrics (per request and tenant, fed by the usage record), replica_metrics
(per replica: vLLM engine, adapters, routing, ledger), recorder (a replica's Metrics from
MetricsConfig), publisher (the gauges' periodic copy), sink (Ray's metrics: the one edge),
process (the replica's Metrics for the router), discovery (the scrape targets).
"""
from loraplex.metrics.config import MetricsConfig
from loraplex.metrics.recorder import DISABLED, Metrics

__all__ = ["DISABLED", "Metrics", "MetricsConfig"]
