"""RoutingConfig: how ingress replicas pick an Engine replica for each request."""
from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from loraplex.routing.policies import POLICIES, make_policy
from loraplex.routing.request_key import CHARS_PER_TOKEN

ROUTER_CLASS = "loraplex.routing.serve_router:TenantAffinityRouter"


class RoutingConfig(BaseModel):
    """The Engine deployment's request router (`TenantAffinityRouter`) and its policy."""

    model_config = ConfigDict(extra="forbid")

    policy: str = Field(
        "tenant_affinity",
        description="Routing policy: tenant_affinity (rendezvous hashing of tenant[/adapter] "
        "under a load bound), or for comparison power_of_two (Serve's default), round_robin, "
        "least_pending_tokens, prefix_tree (like Ray's PrefixCacheAffinityRouter), "
        "cache_aware (like SGLang's router), sticky_hash (rendezvous, load ignored).",
    )
    load_factor: float = Field(
        1.25, ge=1.0,
        description="tenant_affinity: c. No replica is sent a request that would put it above "
        "c x the mean in-flight requests, if any replica has room.",
    )
    new_key_load_factor: Optional[float] = Field(
        1.1, ge=1.0,
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
        "prefix_tree / cache_aware size their indexes to it.",
    )
    served_keys: int = Field(
        256, gt=0,
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
    block_chars: int = Field(
        64, gt=0,
        description="prefix_tree / cache_aware: prompts are hashed in blocks of this many "
        "characters (~16 tokens at 4 characters a token).",
    )
    max_prefix_chars: int = Field(
        32_768, gt=0, description="prefix_tree / cache_aware: characters of a prompt hashed."
    )
    output_tokens: int = Field(
        128, gt=0,
        description="Completion tokens assumed for pending-token counts when a request sets no "
        "max_tokens.",
    )
    policy_options: dict[str, Any] = Field(
        default_factory=dict,
        description="Any other constructor option of the chosen policy (e.g. cache_aware's "
        "cache_threshold); overrides the ones derived from the fields above.",
    )

    @field_validator("policy")
    @classmethod
    def _known_policy(cls, v: str) -> str:
        if v not in POLICIES:
            raise ValueError(f"unknown routing policy {v!r}; choose one of {sorted(POLICIES)}")
        return v

    @model_validator(mode="after")
    def _policy_accepts_its_options(self) -> "RoutingConfig":
        try:
            make_policy(self.policy, **self.policy_kwargs())
        except TypeError as e:
            raise ValueError(f"routing policy {self.policy!r}: {e}") from None
        return self

    def policy_kwargs(self) -> dict[str, Any]:
        """The chosen policy's constructor options."""
        options: dict[str, Any] = {}
        if self.policy == "tenant_affinity":
            options = {"c": self.load_factor, "c_new": self.new_key_load_factor,
                       "min_bound": self.min_bound, "keys_per_replica": self.keys_per_replica,
                       "tokens_per_replica": self.tokens_per_replica}
        elif self.policy in ("prefix_tree", "cache_aware") and self.tokens_per_replica:
            options = {"blocks_per_replica": max(
                1, self.tokens_per_replica * CHARS_PER_TOKEN // self.block_chars)}
        return {**options, **self.policy_options}

    def request_router_kwargs(self) -> dict[str, Any]:
        """What Serve passes to TenantAffinityRouter.initialize_state (JSON-serializable)."""
        return {
            "policy": self.policy,
            "ranked_choices": self.ranked_choices,
            # An engine report can be up to a period old when it arrives (plus jitter):
            # keys routed within two periods survive a report that does not list them yet.
            "stats_window_s": 2 * self.stats_period_s,
            "block_chars": self.block_chars,
            "max_prefix_chars": self.max_prefix_chars,
            "output_tokens": self.output_tokens,
            **self.policy_kwargs(),
        }

    def request_router_config(self):
        """Ray Serve's RequestRouterConfig for the Engine deployment:
        `serve.deployment(..., request_router_config=routing.request_router_config())`."""
        from ray.serve.config import RequestRouterConfig

        return RequestRouterConfig(
            request_router_class=ROUTER_CLASS,
            request_router_kwargs=self.request_router_kwargs(),
            request_routing_stats_period_s=self.stats_period_s,
            request_routing_stats_timeout_s=self.stats_timeout_s,
        )
