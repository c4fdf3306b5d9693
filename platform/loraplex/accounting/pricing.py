from dataclasses import dataclass, field
from decimal import Decimal
from typing import Callable, Mapping

from loraplex.accounting.config import PricingConfig, TokenPrice

MILLION = Decimal(1_000_000)
METERS = ("input_tokens", "cached_input_tokens", "output_tokens")  # what a tenant is billed for
BATCH_PREFIX = "batch_"  # a Batch API line's meters: batch_input_tokens, ... (at the batch price)
BATCH_METERS = tuple(BATCH_PREFIX + m for m in METERS)
ALL_METERS = METERS + BATCH_METERS


def meter_quantities(prompt_tokens: int, cached_prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    """Token counts as the billed meters: uncached prompt tokens (the one place the cached ones
    are taken off the prompt), cached prompt tokens, completion tokens."""
    return {"input_tokens": prompt_tokens - cached_prompt_tokens, "cached_input_tokens": cached_prompt_tokens,
            "output_tokens": completion_tokens}


def billed_quantities(prompt_tokens: int, cached_prompt_tokens: int, completion_tokens: int,
                      batch: bool = False) -> dict[str, int]:
    """meter_quantities under the meters they are billed as: batch_* for Batch API lines."""
    quantities = meter_quantities(prompt_tokens, cached_prompt_tokens, completion_tokens)
    return {BATCH_PREFIX + m: q for m, q in quantities.items()} if batch else quantities


@dataclass(frozen=True)
class Price:
    """Per 1M tokens. Cached prompt tokens are billed at `cached_input`, the rest at `input`."""

    input: Decimal
    cached_input: Decimal
    output: Decimal
    batch_discount: Decimal = Decimal(0)  # fraction off for the batch_* meters
    # Base model id -> its own prices (already resolved, no `models` of their own); a base not
    # here is priced as above.
    models: Mapping[str, "Price"] = field(default_factory=dict)

    def for_model(self, base_model: str | None) -> "Price":
        """The price of base_model's tokens (None: these prices, as for a base without its own)."""
        return self.models.get(base_model, self) if base_model is not None else self

    def unit_price(self, meter: str) -> Decimal:
        """Per 1M tokens of a meter (ALL_METERS: a batch_* one at the batch discount)."""
        if meter.startswith(BATCH_PREFIX):
            return self.unit_price(meter[len(BATCH_PREFIX):]) * (1 - self.batch_discount)
        return {"input_tokens": self.input, "cached_input_tokens": self.cached_input, "output_tokens": self.output}[meter]

    def amount(self, meter: str, quantity: int) -> Decimal:
        """What `quantity` tokens of `meter` cost, exact (integer tokens times a Decimal price,
        one division by 1e6: never rounds at 28 digits)."""
        return Decimal(quantity) * self.unit_price(meter) / MILLION

    def cost(self, prompt_tokens: int, cached_prompt_tokens: int, completion_tokens: int, batch: bool = False) -> Decimal:
        quantities = billed_quantities(prompt_tokens, cached_prompt_tokens, completion_tokens, batch)
        return sum((Decimal(q) * self.unit_price(m) for m, q in quantities.items()), Decimal(0)) / MILLION


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

    def price_for(self, tenant_id: str, base_model: str | None = None) -> Price:
        """The tenant's price for base_model's tokens (None: its price for a base without its own)."""
        if tenant_id in self.tenant_overrides:
            return self.tenant_overrides[tenant_id].for_model(base_model)
        return self.plans[self.plan_for(tenant_id)].for_model(base_model)

    def cost(self, tenant_id: str, prompt_tokens: int, cached_prompt_tokens: int, completion_tokens: int,
             batch: bool = False, base_model: str | None = None) -> Decimal:
        """What the tokens cost the tenant; pass the records' base_model: bases may differ in price."""
        return self.price_for(tenant_id, base_model).cost(prompt_tokens, cached_prompt_tokens, completion_tokens,
                                                          batch)


def as_price(p: TokenPrice) -> Price:
    """A configured price as a Price, with its per-base prices resolved (unset fields: p's own)."""
    return Price(p.input, p.cached_input, p.output, p.batch_discount,
                 models={m: as_price(p.for_model(m)) for m in p.models})
