from decimal import Decimal

from pydantic import BaseModel, ConfigDict, Field



DEFAULT_PLAN = "default"  # the plan new tenants get (tenancy.models): it must have prices


class TokenPrice(BaseModel):
    """Prices per 1M tokens, in the price book's currency."""

    model_config = ConfigDict(extra="forbid")

    input: Decimal = Field(description="Price per 1M uncached prompt tokens.")
    cached_input: Decimal = Field(description="Price per 1M prompt tokens served from the prefix cache.")
    output: Decimal = Field(description="Price per 1M completion tokens.")


class PricingConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    currency: str = Field("USD", description="ISO-4217 code shown on reports, statements and exports.")
    default_plan: str = Field(DEFAULT_PLAN, description="Prices for tenants whose plan has none of its own.")
    plans: dict[str, TokenPrice] = Field(
        default_factory=lambda: {DEFAULT_PLAN: TokenPrice(input=Decimal("0.50"), cached_input=Decimal("0.05"),
                                                        output=Decimal("1.50"))},
        description="Prices per plan name.")
    tenant_overrides: dict[str, TokenPrice] = Field(
        default_factory=dict, description="Negotiated prices by tenant id; win over the tenant's plan.")


class CostModelConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    gpu_hour_price: Decimal = Field(Decimal("3.50"), description="What one GPU-hour costs us (same currency).")
    gpus: int = Field(1, ge=1, description="GPUs serving the deployment.")
    window_s: int = Field(60, ge=1, description="Bucket width for measuring peak tokens/s.")


class AccountingConfig(BaseModel):
    """Usage records go to PlatformConfig.database_url through a per-replica local spool."""

    model_config = ConfigDict(extra="forbid")

    spool_dir: str = Field("var/spool", description="Node-local directory for the usage spool, one subdirectory per replica; may name environment variables ($VAR, ~), expanded on each node.")
    sync_mode: str = Field("batch", description="'batch': group fsync every fsync_interval_s; 'always': fsync per record.")
    fsync_interval_s: float = Field(0.05, gt=0, description="Max seconds of records a power loss can take (batch mode).")
    flush_interval_s: float = Field(1.0, gt=0, description="How often the spool is copied into the database.")
    flush_batch: int = Field(1000, ge=1, description="Flush early once this many records are pending.")
    billing_grace_s: int = Field(3600, ge=0, description="A day is exported for billing only this long after it ends.")
    billing_source: str = Field("loraplex", description="CloudEvents `source` of billing events.")
    pricing: PricingConfig = Field(default_factory=PricingConfig, description="Token prices.")
    cost_model: CostModelConfig = Field(default_factory=CostModelConfig, description="GPU cost inputs.")
