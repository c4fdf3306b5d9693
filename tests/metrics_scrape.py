"""Reading the platform's metrics as Prometheus would: scrape every target, parse the text format.

The targets come from loraplex.metrics.discovery.scrape_targets() (every Ray node's metrics
agent). Samples of all targets are merged: a node serves the series of every process on it.
"""

from __future__ import annotations

from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families


@dataclass(frozen=True)
class Sample:
    name: str
    labels: dict
    value: float


def scrape(targets: list[str], prefix: str = "ray_loraplex_") -> list[Sample]:
    """Every sample whose name starts with `prefix`, from every target's /metrics."""
    samples = []
    for target in targets:
        text = httpx.get(f"http://{target}/metrics", timeout=30).text
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name.startswith(prefix):
                    samples.append(Sample(s.name, dict(s.labels), s.value))
    return samples


def total(samples: list[Sample], name: str, **labels) -> float:
    """The sum of `name`'s samples whose labels include `labels` (over replicas and processes)."""
    return sum(s.value for s in samples
               if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))


def label_values(samples: list[Sample], name: str, label: str) -> set[str]:
    return {s.labels[label] for s in samples if s.name == name and label in s.labels}
