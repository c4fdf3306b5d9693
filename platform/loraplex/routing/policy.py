"""The interface every routing policy implements.

A policy ranks candidate replicas for one request and may learn from where requests went. The
Ray RequestRouter wrapper builds the snapshots, takes the first ranked replica that accepts
(falling back to Serve's own choice for replicas the ranking leaves out), and forwards the
callbacks; the simulator does the same with simulated replicas.
"""
from collections.abc import Iterable, Sequence

from loraplex.routing.snapshot import ReplicaSnapshot, RouteRequest


class RoutingPolicy:
    name = "base"
    # Whether rank() reads RouteRequest.prefix_hashes; callers skip hashing prompts otherwise.
    needs_prefix_hashes = False

    def rank(self, request: RouteRequest, replicas: Sequence[ReplicaSnapshot]) -> list[str]:
        """Replica ids, most preferred first; a non-empty prefix when replicas is non-empty."""
        raise NotImplementedError

    def on_routed(self, request: RouteRequest, replica_id: str) -> None:
        """The request was sent to replica_id."""

    def on_replica_removed(self, replica_id: str) -> None:
        """The replica died or was scaled down."""

    def on_stats(self, replica_id: str, held_keys: Iterable[str]) -> None:
        """An engine reported the keys it holds (e.g. loaded adapters)."""
