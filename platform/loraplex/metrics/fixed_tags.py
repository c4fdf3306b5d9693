"""FixedTags: a sink metric with some label values fixed for the whole replica.

An Engine replica serves one base model, so its own metrics carry `model` = that base on every
series; the wrapper adds it to each call, and the recorders name only the labels that vary.
(Ray's own default tags are the sink's, set once for every metric; these are per metric.)
"""

from __future__ import annotations


class FixedTags:
    def __init__(self, metric, fixed: dict[str, str]):
        self.metric = metric
        self.fixed = fixed

    def _tags(self, tags) -> dict[str, str]:
        return {**self.fixed, **tags} if tags else self.fixed

    def inc(self, value=1.0, tags=None):
        self.metric.inc(value, self._tags(tags))

    def zero(self, tags=None):
        self.metric.zero(self._tags(tags))

    def set(self, value, tags=None):
        self.metric.set(value, self._tags(tags))

    def observe(self, value, tags=None):
        self.metric.observe(value, self._tags(tags))
