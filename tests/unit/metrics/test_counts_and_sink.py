"""Counters added up in memory and flushed by the publisher's thread; Ray's metric objects."""

import threading

import pytest

from fake_sink import FakeMetric
from loraplex.metrics import catalog as c
from loraplex.metrics.counts import Counts
from loraplex.metrics.sink import RaySink


def test_a_flush_passes_on_only_what_grew():
    counter = FakeMetric(c.REQUESTS)
    counts = Counts(counter, c.REQUESTS.labels)
    counts.add(("ten_a", "base", "qwen", "ok"))
    counts.add(("ten_a", "base", "qwen", "ok"), 2)
    counts.flush()
    counts.flush()
    counts.add(("ten_b", "bot@1", "qwen", "error"))
    counts.flush()
    assert counter.total(tenant="ten_a", status="ok") == 3 and counter.total(tenant="ten_b") == 1


def test_adding_while_another_thread_flushes_loses_nothing():
    counter = FakeMetric(c.PROMPT_TOKENS)
    counts = Counts(counter, c.PROMPT_TOKENS.labels)
    done = threading.Event()

    def publisher():
        while not done.is_set():
            counts.flush()

    thread = threading.Thread(target=publisher)
    thread.start()
    for i in range(100_000):
        counts.add((f"ten_{i % 7}", "base", "qwen"), 3)
    done.set()
    thread.join()
    counts.flush()
    assert counter.total() == 300_000


@pytest.mark.parametrize("spec", c.ALL, ids=lambda s: s.name)
def test_every_metric_is_made_and_recorded_through_rays_objects(spec):
    serve_tags = {"deployment": "Engine", "replica": "r1", "application": "loraplex"}
    metric = RaySink(default_tags=serve_tags).make(spec)
    assert metric.info["name"] == spec.register_as and metric.info["default_tags"] == serve_tags
    tags = {label: "x" for label in spec.labels}
    if spec.kind == "counter":
        metric.zero(tags)
        metric.inc(2, tags)
    elif spec.kind == "gauge":
        metric.set(0.5, tags)
    else:
        assert metric.boundaries == list(spec.buckets)
        metric.observe(0.5, tags)
    if spec.labels:  # Ray checks every label is given
        with pytest.raises(ValueError):
            (metric.set if spec.kind == "gauge" else metric.observe if spec.kind == "histogram" else metric.inc)(1, {})


def test_names_as_exported():
    assert c.PROMPT_TOKENS.register_as == "loraplex_prompt_tokens"
    assert c.PROMPT_TOKENS.exported == "ray_loraplex_prompt_tokens_total"
    assert c.TTFT.exported == "ray_loraplex_time_to_first_token_seconds"
    assert len({s.name for s in c.ALL}) == len(c.ALL)
    assert all(s.name.startswith("loraplex_") and (s.kind == "counter") == s.name.endswith("_total") for s in c.ALL)
