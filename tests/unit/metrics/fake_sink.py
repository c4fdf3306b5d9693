"""FakeSink: stands in for RaySink (Ray's metrics) in unit tests, and checks calls as Ray would.

Like ray.util.metrics it refuses a counter increment <= 0 and tags that are not exactly the
metric's labels; it keeps every series' value so a test can read what would be exported.
"""

from __future__ import annotations

from collections import defaultdict

from loraplex.metrics.catalog import MetricSpec


def _key(spec: MetricSpec, tags) -> tuple:
    tags = dict(tags or {})
    assert set(tags) == set(spec.labels), f"{spec.name}: tags {sorted(tags)} != labels {sorted(spec.labels)}"
    assert all(isinstance(v, str) for v in tags.values()), tags
    return tuple(sorted(tags.items()))


class FakeMetric:
    def __init__(self, spec: MetricSpec):
        self.spec = spec
        self.values: dict[tuple, float] = {}  # counter / gauge value per series
        self.observations: dict[tuple, list[float]] = defaultdict(list)  # histogram

    def inc(self, value=1.0, tags=None):
        assert self.spec.kind == "counter"
        assert value > 0, f"{self.spec.name}: Ray refuses inc({value})"
        key = _key(self.spec, tags)
        self.values[key] = self.values.get(key, 0.0) + value

    def zero(self, tags=None):
        assert self.spec.kind == "counter"
        self.values.setdefault(_key(self.spec, tags), 0.0)

    def set(self, value, tags=None):
        assert self.spec.kind == "gauge"
        self.values[_key(self.spec, tags)] = float(value)

    def observe(self, value, tags=None):
        assert self.spec.kind == "histogram"
        self.observations[_key(self.spec, tags)].append(value)

    def series(self) -> set[tuple]:
        return set(self.values) | set(self.observations)

    def label_values(self, label: str) -> set[str]:
        return {dict(k)[label] for k in self.series()}

    def total(self, **labels) -> float:
        """Sum over the series whose labels match (counter / gauge), or count of observations."""
        def match(key):
            d = dict(key)
            return all(d.get(k) == v for k, v in labels.items())
        if self.spec.kind == "histogram":
            return sum(len(obs) for k, obs in self.observations.items() if match(k))
        return sum(v for k, v in self.values.items() if match(k))


class FakeSink:
    def __init__(self):
        self.metrics: dict[str, FakeMetric] = {}

    def make(self, spec: MetricSpec) -> FakeMetric:
        assert spec.name not in self.metrics, f"{spec.name} made twice"
        metric = self.metrics[spec.name] = FakeMetric(spec)
        return metric

    def __getitem__(self, name: str) -> FakeMetric:
        return self.metrics[name]
