"""Counts: counters added up in the replica's memory, handed to Ray by the publisher.

A Ray counter record costs a few microseconds (tags merged and checked, then the OpenTelemetry
SDK's lookup); a request would pay it for each of its counters. Here the request path adds to
a Python int per label set, and the publisher thread passes what grew since its last flush to
Ray, one record per series and period. Exported counters lag by up to one publish period.

No lock: only the request path's thread adds (one event loop), only the publisher flushes. The
totals are never reset, so a flush that reads a total mid-update misses nothing: the rest goes
out with the next flush.
"""

from __future__ import annotations


class Counts:
    def __init__(self, counter, labels: tuple[str, ...]):
        self.counter = counter  # the sink's counter
        self.labels = labels
        self.totals: dict[tuple[str, ...], int] = {}
        self._sent: dict[tuple[str, ...], int] = {}

    def add(self, key: tuple[str, ...], n: int = 1) -> None:
        """Count n (> 0) for the label values `key` (in `labels` order)."""
        self.totals[key] = self.totals.get(key, 0) + n

    def flush(self) -> None:
        sent = self._sent
        for key, total in list(self.totals.items()):  # list(): one atomic copy under the GIL
            grown = total - sent.get(key, 0)
            if grown > 0:
                self.counter.inc(grown, dict(zip(self.labels, key)))
                sent[key] = total
