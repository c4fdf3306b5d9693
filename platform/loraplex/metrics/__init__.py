"""Prometheus metrics `loraplex_*` from every Engine and Ingress replica (docs/metrics.md).

catalog (every metric: name, type, labels, and the histogram bounds after OpenTelemetry's GenAI
conventions), label_guard (the tenant/adapter cardinality guard), request_metrics (per request
and tenant, fed by the usage record; the ledger status -> `status` outcome), replica_metrics
(per replica: vLLM engine, adapters, routing, ledger), recorder (a replica's Metrics from
MetricsConfig, and the one installed in this process for the router), publisher (the gauges'
periodic copy), sink (Ray's metrics: the one edge), discovery (the scrape targets).

Import the module you need: this file imports nothing, so loading the config loads no recorder.
"""
