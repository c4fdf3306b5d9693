"""Where recorded values go: Ray's metrics, the thin edge between our recorders and Ray.

`RaySink` makes one `ray.util.metrics` object per MetricSpec, with the replica's `deployment`,
`replica` and `application` as default tags (the labels Serve's own metrics carry, set once
rather than looked up on every record as ray.serve.metrics does). Every process's core worker
pushes its values to the node's metrics agent, which serves them to Prometheus at the node's
metrics export port (docs/metrics.md). Outside Ray (unit tests, scripts without ray.init)
recording works and goes nowhere.

A sink only has to make objects with Ray's three calls: `inc(value, tags)`, `observe(value, tags)`,
`set(value, tags)`, and `zero(tags)` for a counter: a series that exists at 0 before its first
event, so Prometheus's rate() and increase() count that first event.
"""

from __future__ import annotations

import logging
import sys
import threading

from loraplex.metrics.catalog import MetricSpec

logger = logging.getLogger(__name__)

SERVE_LABELS = ("deployment", "replica", "application")


def serve_labels() -> dict[str, str]:
    """This Serve replica's labels, as Serve's own metrics name them; {} outside a replica."""
    from ray import serve

    try:
        context = serve.get_replica_context()
    except Exception:
        return {}
    return {"deployment": context.deployment, "replica": context.replica_tag, "application": context.app_name or ""}


class RaySink:
    def __init__(self, default_tags: dict[str, str] | None = None):
        self.default_tags = serve_labels() if default_tags is None else default_tags

    def make(self, spec: MetricSpec):
        from ray.util import metrics

        keys = tuple(self.default_tags) + spec.labels
        if spec.kind == "counter":
            metric = metrics.Counter(spec.register_as, description=spec.help, tag_keys=keys)
            metric.zero = lambda tags=None, m=metric: _zero(m, tags)
        elif spec.kind == "gauge":
            metric = metrics.Gauge(spec.register_as, description=spec.help, tag_keys=keys)
        elif spec.kind == "histogram":
            metric = metrics.Histogram(spec.register_as, description=spec.help, boundaries=list(spec.buckets),
                                       tag_keys=keys)
        else:
            raise ValueError(f"unknown metric kind {spec.kind!r}")
        return metric.set_default_tags(dict(self.default_tags))


def _zero(counter, tags) -> None:
    # Counter.inc refuses 0; the Cython metric below it records it (an OpenTelemetry counter
    # accepts any non-negative add), which makes the series appear at 0.
    try:
        final = counter._get_final_tags(tags or {})
        counter._validate_tags(final)
        counter._metric.record(0.0, tags=final)
    except Exception:  # a Ray without this private path: the series appears at its first event
        logger.debug("could not zero %s", counter.info.get("name"), exc_info=True)


class ProcessCounter:
    """A counter of this process, made on first use with the Serve replica's labels, for code that
    has no recorder of its own (the adapter store's calls, the node's disks). Its one label's
    known values (`spec.values`) are zeroed by `start()`; counting outside a Ray worker (unit
    tests, scripts) goes nowhere and imports nothing of Ray."""

    def __init__(self, spec: MetricSpec):
        self.spec = spec
        self.label = spec.labels[0]
        self._metric = None
        self._lock = threading.Lock()

    def _made(self):
        with self._lock:
            if self._metric is None:
                self._metric = RaySink().make(self.spec)
        return self._metric

    def start(self) -> None:
        """Export the counter at 0 for each known value (a replica's start): an alert's rate() or
        increase() needs the series before the first event, and a scrape shows every metric."""
        try:
            metric = self._made()
            for value in (self.spec.values or {}).get(self.label, ()):
                metric.zero({self.label: value})
        except Exception:  # outside Ray: nowhere to count
            logger.debug("could not start %s", self.spec.name, exc_info=True)

    def inc(self, value: str) -> None:
        """One event with the label at `value`."""
        if "ray" not in sys.modules:  # not a Ray worker: nowhere to count, and no import of Ray
            return
        try:
            self._made().inc(1, tags={self.label: value})
        except Exception:  # outside Ray
            logger.debug("could not count %s{%s=%s}", self.spec.name, self.label, value, exc_info=True)
