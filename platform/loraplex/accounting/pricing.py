from dataclasses import dataclass, field
from decimal import Decimal
from typing import Callable

from loraplex.accounting.config import PricingConfig

MILLION = Decimal(1_000_000)


@dataclass(frozen=True)
class Price:
    """Per 1M tokens. Cached prompt tokens are billed at `cached_input`, the rest at `input`."""

    input: Decimal
    cached_input: Decimal
    output: Decimal

    def cost(self, prompt_tokens: int, cached_prompt_tokens: int, completion_tokens: int) -> Decimal:
        # Exact: integer tokens times Decimal prices, one division by 1e6 (never rounds at 28 digits).
        units = (Decimal(prompt_tokens - cached_prompt_tokens) * self.input
                 + Decimal(cached_prompt_tokens) * self.cached_input
                 + Decimal(completion_tokens) * self.output)
        return units / MILLION


@dataclass
class PriceBook:
    """Which price applies to a tenant: its override, else its plan's, else the default plan's."""

    plans: dict[str, Price]
    default_plan: str
    currency: str = "USD"
    tenant_overrides: dict[str, Price] = field(default_factory=dict)
    plan_of: Callable[[str], str | None] = lambda tenant_id: None  # tenancy supplies the lookup

    @classmethod
    def from_config(cls, cfg: PricingConfig, plan_of: Callable[[str], str | None] | None = None) -> "PriceBook":
        as_price = lambda p: Price(p.input, p.cached_input, p.output)  # noqa: E731
        if cfg.default_plan not in cfg.plans:
            raise ValueError(f"default_plan {cfg.default_plan!r} has no prices")
        return cls(plans={k: as_price(v) for k, v in cfg.plans.items()}, default_plan=cfg.default_plan,
                   currency=cfg.currency, tenant_overrides={k: as_price(v) for k, v in cfg.tenant_overrides.items()},
                   plan_of=plan_of or (lambda tenant_id: None))

    def plan_for(self, tenant_id: str) -> str:
        if tenant_id in self.tenant_overrides:
            return "override"
        plan = self.plan_of(tenant_id)
        return plan if plan in self.plans else self.default_plan

    def price_for(self, tenant_id: str) -> Price:
        if tenant_id in self.tenant_overrides:
            return self.tenant_overrides[tenant_id]
        return self.plans[self.plan_for(tenant_id)]

    def cost(self, tenant_id: str, prompt_tokens: int, cached_prompt_tokens: int, completion_tokens: int) -> Decimal:
        return self.price_for(tenant_id).cost(prompt_tokens, cached_prompt_tokens, completion_tokens)
