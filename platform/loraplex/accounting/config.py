from decimal import Decimal
from typing import Optional

from pydantic import BaseModel, ConfigDict, Field



DEFAULT_PLAN = "default"  # the plan new tenants get (tenancy.models): it must have prices


class ModelTokenPrice(BaseModel):
    """One base model's prices within a plan or an override; a field left out is the plan's own."""

    model_config = ConfigDict(extra="forbid")

    input: Optional[Decimal] = Field(None, description="Price per 1M uncached prompt tokens; unset: the plan's.")
    cached_input: Optional[Decimal] = Field(
        None, description="Price per 1M prompt tokens served from the prefix cache; unset: the plan's.")
    output: Optional[Decimal] = Field(None, description="Price per 1M completion tokens; unset: the plan's.")
    batch_discount: Optional[Decimal] = Field(
        None, ge=0, le=1, description="Fraction off for Batch API lines on this base; unset: the plan's.")


class TokenPrice(BaseModel):
    """Prices per 1M tokens, in the price book's currency: for every base model, unless `models`
    prices a base differently."""

    model_config = ConfigDict(extra="forbid")

    input: Decimal = Field(description="Price per 1M uncached prompt tokens.")
    cached_input: Decimal = Field(description="Price per 1M prompt tokens served from the prefix cache.")
    output: Decimal = Field(description="Price per 1M completion tokens.")
    batch_discount: Decimal = Field(
        Decimal("0.5"), ge=0, le=1,
        description="Fraction taken off every price for Batch API lines (0.5: half price, as OpenAI's); their "
        "tokens are billed as the batch_* meters at the discounted prices.")
    models: dict[str, ModelTokenPrice] = Field(
        default_factory=dict,
        description="Prices of the tokens of one base model, by its model id (engine.model_id): e.g. a larger "
        "base dearer. Fields it leaves out, and every base it does not name, get the prices above.")

    def for_model(self, base_model: str) -> "TokenPrice":
        """The prices of base_model's tokens: its entry in `models` over these."""
        own = self.models.get(base_model)
        if own is None:
            return self.model_copy(update={"models": {}})
        return self.model_copy(update={**own.model_dump(exclude_none=True), "models": {}})


class PricingConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    currency: str = Field("USD", description="ISO-4217 code shown on reports, statements and exports.")
    default_plan: str = Field(DEFAULT_PLAN, description="Prices for tenants whose plan has none of its own.")
    plans: dict[str, TokenPrice] = Field(
        default_factory=lambda: {DEFAULT_PLAN: TokenPrice(input=Decimal("0.50"), cached_input=Decimal("0.05"),
                                                        output=Decimal("1.50"))},
        description="Prices per plan name.")
    tenant_overrides: dict[str, TokenPrice] = Field(
        default_factory=dict,
        description="Negotiated prices by tenant id; win over the tenant's plan, for every base (an override's "
        "own `models`, if any, price single bases: the plan's `models` do not apply to an overridden tenant).")

    def priced_models(self) -> set[str]:
        """Every base model id some plan or override prices on its own (to check against the
        deployment's bases: a misspelt id would silently bill at the plan's prices)."""
        return {m for p in (*self.plans.values(), *self.tenant_overrides.values()) for m in p.models}


# What the cost model prices where accounting.cost_model leaves it unset, by profile
# (PlatformConfig picks by engine_deployment.num_gpus): the hardware one unit is, and its hour.
CPU_PROFILE_HARDWARE = "2-vCPU VM"
CPU_PROFILE_HOUR_PRICE = Decimal("0.1008")  # AWS EC2 m7i.large (2 vCPU, 8 GiB), Linux on-demand, us-east-1
GPU_PROFILE_HARDWARE = "GPU"
GPU_PROFILE_HOUR_PRICE = Decimal("3.50")


class BaseModelHardware(BaseModel):
    """What serves one base model's pool (accounting.cost_model.models.<base>); unset fields are the
    deployment's."""

    model_config = ConfigDict(extra="forbid")

    gpus: int = Field(ge=1, description="Units of `hardware` serving this base's pool.")
    gpu_hour_price: Optional[Decimal] = Field(None, ge=0, description="One unit's hour, if not the deployment's.")
    hardware: Optional[str] = Field(None, min_length=1, description="What one unit is, if not the deployment's.")


class CostModelConfig(BaseModel):
    """The hardware the cost model prices. Unset fields follow the profile: the CPU profile's
    (a 2-vCPU VM) here, the GPU profile's where Engine replicas have GPUs (for_profile)."""

    model_config = ConfigDict(extra="forbid")

    gpu_hour_price: Decimal = Field(
        CPU_PROFILE_HOUR_PRICE, ge=0,
        description="What one hour of one unit of `hardware` costs us (same currency as pricing). Unset: "
        f"{GPU_PROFILE_HOUR_PRICE} per GPU where engine_deployment.num_gpus > 0, else {CPU_PROFILE_HOUR_PRICE} "
        "for a 2-vCPU VM (the CPU profile; AWS EC2 m7i.large on-demand, us-east-1).")
    gpus: int = Field(1, ge=1, description="Units of `hardware` serving the deployment (GPUs; VMs on the CPU profile).")
    hardware: str = Field(
        CPU_PROFILE_HARDWARE, min_length=1,
        description="What one unit at gpu_hour_price is, named on the cost model's output (GET /admin/cost-model, "
        f"`loraplex billing cost-model`). Unset: {GPU_PROFILE_HARDWARE!r} where engine_deployment.num_gpus > 0, "
        f"else {CPU_PROFILE_HARDWARE!r}.")
    window_s: int = Field(60, ge=1, description="Bucket width for measuring peak tokens/s.")
    models: dict[str, "BaseModelHardware"] = Field(
        default_factory=dict,
        description="Several base models: the hardware serving each base's pool, for the cost model of one base "
        "(GET /admin/cost-model?model=..., `loraplex billing cost-model --model`); `gpus` / `gpu_hour_price` / "
        "`hardware` above stay the whole deployment's.")

    def for_model(self, model: str) -> "CostModelConfig":
        """The cost model of one base's pool; KeyError when its hardware is not configured."""
        own = self.models[model]
        return self.model_copy(update={k: v for k, v in own.model_dump().items() if v is not None} | {"models": {}})

    def for_profile(self, on_gpu: bool) -> "CostModelConfig":
        """This config with the GPU profile's price and hardware where it leaves them unset and the
        replicas have GPUs (the defaults are the CPU profile's)."""
        if not on_gpu:
            return self
        unset = {"gpu_hour_price": GPU_PROFILE_HOUR_PRICE, "hardware": GPU_PROFILE_HARDWARE}
        update = {k: v for k, v in unset.items() if k not in self.model_fields_set}
        return self.model_copy(update=update) if update else self


class AccountingConfig(BaseModel):
    """Usage records go to PlatformConfig.database_url through a per-replica local spool."""

    model_config = ConfigDict(extra="forbid")

    spool_dir: str = Field("var/spool", description="Node-local directory for the usage spool, one subdirectory per replica; may name environment variables ($VAR, ~), expanded on each node.")
    sync_mode: str = Field("batch", description="'batch': group fsync every fsync_interval_s; 'always': fsync per record.")
    fsync_interval_s: float = Field(0.05, gt=0, description="Max seconds of records a power loss can take (batch mode).")
    flush_interval_s: float = Field(1.0, gt=0, description="How often the spool is copied into the database.")
    flush_batch: int = Field(1000, ge=1, description="Flush early once this many records are pending.")
    max_unspooled_records: int = Field(
        10_000, ge=1,
        description="Usage records an Engine replica holds in memory while its spool's disk refuses them and the "
        "database cannot take them either; at this many it refuses new requests with 503 usage_spool_full "
        "rather than serve one it could not bill.")
    billing_grace_s: int = Field(3600, ge=0, description="A day is exported for billing only this long after it ends.")
    billing_source: str = Field("loraplex", description="CloudEvents `source` of billing events.")
    pricing: PricingConfig = Field(default_factory=PricingConfig, description="Token prices.")
    cost_model: CostModelConfig = Field(default_factory=CostModelConfig, description="What the hardware costs: the cost model's inputs.")
