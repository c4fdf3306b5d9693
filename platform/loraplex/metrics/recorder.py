"""Metrics: what one replica records, built once from the config (`metrics:`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from loraplex.metrics.config import MetricsConfig
from loraplex.metrics.replica_metrics import NoReplicaMetrics, ReplicaMetrics
from loraplex.metrics.request_metrics import NoRequestMetrics, RequestMetrics


@dataclass
class Metrics:
    requests: Union[RequestMetrics, NoRequestMetrics]
    replica: Union[ReplicaMetrics, NoReplicaMetrics]
    config: MetricsConfig

    @property
    def enabled(self) -> bool:
        return self.config.enabled

    def flush(self) -> None:
        """Hand the counters added up in memory to Ray: a publisher source."""
        self.requests.flush()
        self.replica.flush()

    @classmethod
    def for_replica(cls, config: MetricsConfig, role: str, sink=None, base_model: str | None = None) -> "Metrics":
        """role: "engine" or "ingress". sink: RaySink unless a test passes its fake. base_model: an
        Engine replica's base (engine.model_id, required there: its metrics' `model`); on an
        ingress, the base of calls that name none (EngineCall.base_model None). Disabled: the
        no-op recorders, so the request path only pays an empty method call."""
        if not config.enabled:
            return cls(NoRequestMetrics(), NoReplicaMetrics(), config)
        if sink is None:
            from loraplex.metrics.sink import RaySink

            sink = RaySink()
        return cls(RequestMetrics(config, sink, base_model), ReplicaMetrics(sink, role, base_model), config)


DISABLED = Metrics(NoRequestMetrics(), NoReplicaMetrics(), MetricsConfig(enabled=False))


# The metrics of the replica this process runs, for code Serve builds without our arguments:
# Serve builds the ingress's RequestRouter (routing.serve_router) itself, from the Engine
# deployment's router config; it runs in the Ingress replica's process, which installs its
# Metrics here when it starts. A Serve replica is one process, so one slot per process is right.
_installed: Metrics = DISABLED


def install(metrics: Metrics) -> None:
    global _installed
    _installed = metrics


def installed() -> Metrics:
    return _installed
