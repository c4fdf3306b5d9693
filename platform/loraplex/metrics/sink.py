"""Where recorded values go: Ray's metrics, the thin edge between our recorders and Ray.

`RaySink` makes one `ray.serve.metrics` object per MetricSpec. In a Serve replica those add the
replica's `deployment`, `replica` and `application` labels (as Serve's own metrics carry them);
every process's core worker pushes its values to the node's metrics agent, which serves them to
Prometheus at the node's metrics export port (docs/metrics.md). Outside Ray (unit tests, scripts
without ray.init) recording works and goes nowhere.

A sink only has to make objects with Ray's three calls: `inc(value, tags)`, `observe(value, tags)`,
`set(value, tags)`, and `zero(tags)` for a counter: a series that exists at 0 before its first
event, so Prometheus's rate() and increase() count that first event.
"""

from __future__ import annotations

import logging

from loraplex.metrics.catalog import MetricSpec

logger = logging.getLogger(__name__)


class RaySink:
    def make(self, spec: MetricSpec):
        from ray.serve import metrics as serve_metrics

        if spec.kind == "counter":
            metric = serve_metrics.Counter(spec.register_as, description=spec.help, tag_keys=spec.labels)
            metric.zero = lambda tags=None, m=metric: _zero(m, tags)
            return metric
        if spec.kind == "gauge":
            return serve_metrics.Gauge(spec.register_as, description=spec.help, tag_keys=spec.labels)
        if spec.kind == "histogram":
            return serve_metrics.Histogram(spec.register_as, description=spec.help, boundaries=list(spec.buckets),
                                           tag_keys=spec.labels)
        raise ValueError(f"unknown metric kind {spec.kind!r}")


def _zero(counter, tags) -> None:
    # Counter.inc refuses 0; the Cython metric below it records it (an OpenTelemetry counter
    # accepts any non-negative add), which makes the series appear at 0.
    try:
        final = counter._get_final_tags(tags or {})
        counter._validate_tags(final)
        counter._metric.record(0.0, tags=final)
    except Exception:  # a Ray without this private path: the series appears at its first event
        logger.debug("could not zero %s", counter.info.get("name"), exc_info=True)
