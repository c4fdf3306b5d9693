"""The interface every routing policy implements.

A policy turns an Engine call into the RouteRequest it ranks by, ranks candidate replicas for
it, and may learn from where requests went. The Ray RequestRouter wrapper builds the snapshots,
takes the first ranked replica that accepts (falling back to Serve's own choice for replicas
the ranking leaves out), and forwards the callbacks; the simulator does the same with
simulated replicas.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, Optional, Protocol

from loraplex.routing.snapshot import ReplicaSnapshot, RouteRequest

if TYPE_CHECKING:
    from loraplex.contract import EngineCall


class RoutingSettings(Protocol):
    """What a policy reads of its deployment's `routing:` settings (routing/config.py's
    RoutingConfig, which builds policies and so is not imported here)."""

    load_factor: float
    new_key_load_factor: Optional[float]
    min_bound: int
    keys_per_replica: Optional[int]
    tokens_per_replica: Optional[int]
    policy_options: dict[str, Any]


class RoutingPolicy:
    name = "base"

    @classmethod
    def from_config(cls, config: RoutingSettings) -> RoutingPolicy:
        """The policy a deployment's `routing:` config asks for; policies that read other
        config fields (load factors, cache size) override this."""
        return cls(**config.policy_options)

    def route(self, call: EngineCall, request: Any) -> RouteRequest:
        """What to rank by for a call that has a routing key. `request` is the call's OpenAI
        request (vLLM's ChatCompletionRequest or CompletionRequest); only policies that match
        prompts read it, the others need no more than the key and the prompt estimate."""
        return RouteRequest(call.routing_key, call.prompt_tokens)

    def rank(self, request: RouteRequest, replicas: Sequence[ReplicaSnapshot]) -> list[str]:
        """Replica ids, most preferred first; a non-empty prefix when replicas is non-empty."""
        raise NotImplementedError

    def holders(self, request: RouteRequest, replicas: Sequence[ReplicaSnapshot]) -> set[str] | None:
        """The replicas that hold the request's key, as the policy sees them (None: it does not
        track holders). Read after `rank` for the routing-decision metric."""
        return None

    def on_routed(self, request: RouteRequest, replica_id: str) -> None:
        """The request was sent to replica_id."""

    def on_replica_removed(self, replica_id: str) -> None:
        """The replica died or was scaled down."""

    def on_stats(self, replica_id: str, held_keys: Iterable[str]) -> None:
        """An engine reported the keys it holds (e.g. loaded adapters)."""
