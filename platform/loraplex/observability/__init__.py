"""Observability around the platform: SLOs (slo.py), the PromQL they and the dashboard use
(names.py, promql.py), generated Prometheus rules, their promtool tests, the Grafana dashboard
and the Prometheus scrape config. `python -m loraplex.observability serve_config.yaml` writes
them under deploy/; scripts/prometheus runs a Prometheus with them next to the platform."""
