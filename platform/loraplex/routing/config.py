"""RoutingConfig: how ingress replicas pick an Engine replica for each request."""
from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from loraplex.routing.bounded_load import DEFAULT_LOAD_FACTOR, DEFAULT_NEW_KEY_LOAD_FACTOR
from loraplex.routing.policies import BUILT_IN, policy_class
from loraplex.routing.policy import RoutingPolicy
from loraplex.routing.served_keys import DEFAULT_SERVED_KEYS

class RoutingConfig(BaseModel):
    """The Engine deployment's request router (`TenantAffinityRouter`) and its policy."""

    model_config = ConfigDict(extra="forbid")

    policy: str = Field(
        "tenant_affinity",
        description=f"Routing policy: one of {sorted(BUILT_IN)} (tenant_affinity: rendezvous "
        "hashing of tenant[/adapter] under a load bound; residency_aware: the same, plus where each "
        "adapter is resident (GPU slot > CPU tier > cold) and each replica's free LoRA slots; "
        "power_of_two: Serve's default router), "
        "or a RoutingPolicy class as 'module:Class', importable in every Serve replica (the "
        "comparison policies in bench.routing, e.g. 'bench.routing.cache_aware:CacheAwarePolicy').",
    )
    load_factor: float = Field(
        DEFAULT_LOAD_FACTOR, ge=1.0,
        description="tenant_affinity: c. No replica is sent a request that would put it above "
        "c x the mean load (in-flight requests, plus those its engine queues), if any replica "
        "has room.",
    )
    new_key_load_factor: Optional[float] = Field(
        DEFAULT_NEW_KEY_LOAD_FACTOR, ge=1.0,
        description="tenant_affinity: the bound (x the mean) for sending a key to a replica that "
        "does not hold it yet. Such a request misses the cache wherever it goes, so it goes "
        "where there is room, and held keys keep the rest of the bound. null: load_factor.",
    )
    min_bound: int = Field(
        4, ge=0,
        description="tenant_affinity: a replica may always take this many in-flight requests, "
        "so a nearly idle pool keeps each tenant on one replica.",
    )
    keys_per_replica: Optional[int] = Field(
        256, gt=0,
        description="tenant_affinity: affinity keys the router remembers per replica (LRU); "
        "null: no cap (the engines' reports still prune).",
    )
    tokens_per_replica: Optional[int] = Field(
        None, gt=0,
        description="One replica's prefix-cache capacity in tokens (vLLM's KV blocks x block "
        "size). When set, tenant_affinity forgets keys as that cache would evict them, and "
        "the prefix-matching comparison policies size their indexes to it.",
    )
    served_keys: int = Field(
        DEFAULT_SERVED_KEYS, gt=0,
        description="Affinity keys each Engine replica remembers serving and reports in its "
        "routing stats (most recent first).",
    )
    ranked_choices: int = Field(
        3, gt=0,
        description="How many replicas of the policy's ranking Serve tries one by one (skipping "
        "full queues) before it takes the least loaded of the rest.",
    )
    stats_period_s: float = Field(
        10.0, gt=0, description="How often Serve collects each Engine replica's routing stats."
    )
    stats_timeout_s: float = Field(
        30.0, gt=0, description="A routing-stats call slower than this is dropped."
    )
    output_tokens: int = Field(
        128, gt=0,
        description="Completion tokens assumed for pending-token counts (ReplicaView.pending_tokens) "
        "when a request sets no max_tokens. Only a policy that weighs pending tokens reads them: none "
        "of the built-in ones does (e.g. 'bench.routing.baselines:LeastPendingTokensPolicy' does).",
    )
    policy_options: dict[str, Any] = Field(
        default_factory=dict,
        description="Any other constructor option of the chosen policy (e.g. cache_aware's "
        "cache_threshold or block_chars); overrides the ones derived from the fields above.",
    )

    @field_validator("policy")
    @classmethod
    def _known_policy(cls, v: str) -> str:
        policy_class(v)  # ValueError names the choices, or why an import path does not load
        return v

    @model_validator(mode="after")
    def _policy_accepts_its_options(self) -> "RoutingConfig":
        try:
            policy = self.make_policy()
        except TypeError as e:
            raise ValueError(f"routing policy {self.policy!r}: {e}") from None
        if policy is None and self.policy_options:
            raise ValueError(f"routing policy {self.policy!r} takes no policy_options")
        return self

    def make_policy(self) -> RoutingPolicy | None:
        """A fresh policy built from this config; None for Serve's own power of two."""
        cls = policy_class(self.policy)
        return None if cls is None else cls.from_config(self)

    def request_router_kwargs(self) -> dict[str, Any]:
        """What Serve passes to TenantAffinityRouter.initialize_state: this config, as JSON,
        which the router validates again and builds its policy from."""
        return self.model_dump(mode="json")

    def request_router_config(self, router_class: type):
        """Ray Serve's RequestRouterConfig for the Engine deployment, with `router_class`
        (routing.serve_router.TenantAffinityRouter, passed as a class so a reader follows the
        import, not a string): `serve.deployment(..., request_router_config=...)`."""
        from ray.serve.config import RequestRouterConfig

        return RequestRouterConfig(
            request_router_class=router_class,
            request_router_kwargs=self.request_router_kwargs(),
            request_routing_stats_period_s=self.stats_period_s,
            request_routing_stats_timeout_s=self.stats_timeout_s,
        )
