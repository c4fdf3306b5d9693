"""Tenancy's data: limits, tenants, API key records, the principal a request runs as, the admin
request bodies (validated before anything is stored), and their database tables."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator
from sqlalchemy import JSON, CheckConstraint, Column, ForeignKey, Index, String, Table

from loraplex.accounting.config import DEFAULT_PLAN
from loraplex.db.base import Base
from loraplex.db.migrations import Migration
from loraplex.db.types import UTCDateTime

class BaseLimits(BaseModel):
    """A tenant's extra limits on one base model (TenantLimits.models): a request on that base must
    fit these and the tenant-wide ones. A missing or null limit means the plan's for that base
    (none when the plan sets none)."""

    model_config = ConfigDict(extra="forbid")

    requests_per_minute: Optional[int] = Field(
        None, ge=1, description="Requests on this base admitted per rolling minute.")
    tokens_per_minute: Optional[int] = Field(
        None, ge=1, description="Prompt + completion tokens on this base admitted per rolling minute.")
    max_concurrent_requests: Optional[int] = Field(
        None, ge=1, description="Sequences on this base in flight at once.")
    monthly_token_budget: Optional[int] = Field(
        None, ge=1, description="Prompt + completion tokens on this base per calendar month (UTC).")

    def over(self, plan: Optional["BaseLimits"]) -> "BaseLimits":
        """The limits in force on this base: this tenant's own, and the plan's where it set none."""
        return self if plan is None else BaseLimits.model_validate(_own_else_plan(self, plan))


class TenantLimits(BaseModel):
    """A missing or null limit means the plan's (unlimited when the plan sets none, `over`);
    suspend the tenant to block it entirely."""

    # Unknown keys are refused: a typo like "request_per_minute" would otherwise be silently unlimited.
    model_config = ConfigDict(extra="forbid")

    requests_per_minute: Optional[int] = Field(None, ge=1, description="Requests admitted per rolling minute.")
    tokens_per_minute: Optional[int] = Field(
        None, ge=1, description="Prompt + completion tokens admitted per rolling minute."
    )
    max_concurrent_requests: Optional[int] = Field(None, ge=1, description="Requests in flight at once.")
    monthly_token_budget: Optional[int] = Field(
        None, ge=1, description="Prompt + completion tokens per calendar month (UTC)."
    )
    priority: int = Field(
        0, ge=0, le=100, description="Load-shedding priority: under overload lower priorities are shed first."
    )
    slo_class: Optional[str] = Field(
        None, min_length=1, max_length=64,
        description="The latency class (slo.classes) its requests are served and counted by; null: its plan's, "
        "else slo.default_class. A class no longer configured counts as the default.")
    max_adapter_versions: Optional[int] = Field(
        None, ge=0,
        description="Live adapter versions the tenant may hold (all names); an upload of new weights past it "
        "gets 409 naming the quota: delete versions (DELETE /v1/adapters/{name@version}) first.",
    )
    max_adapter_bytes: Optional[int] = Field(
        None, ge=0,
        description="Bytes of adapter weights + config over the tenant's live versions; an upload that would "
        "pass it gets 413 naming the quota: delete versions first.",
    )
    # The Batch API's (issue 36): checked by POST /v1/files and POST /v1/batches.
    max_batch_files: Optional[int] = Field(
        None, ge=0, description="Batch input files (purpose=batch) the tenant may hold; an upload past it gets "
        "409 naming the quota: delete files (DELETE /v1/files/{id}) first.")
    max_batch_file_bytes: Optional[int] = Field(
        None, ge=0, description="Bytes of the tenant's batch input files together; an upload that would pass it "
        "gets 413 naming the quota.")
    max_batches_in_flight: Optional[int] = Field(
        None, ge=0, description="Batches of the tenant not yet ended (validating, in_progress, finalizing, "
        "cancelling); a create past it gets 429 naming the quota.")
    batch_tokens_per_day: Optional[int] = Field(
        None, ge=1, description="Prompt + completion tokens the tenant's batch lines may use per UTC day. A line "
        "that would pass it is not failed: its batch waits (still in_progress) until the next UTC day, or "
        "expires if its completion window ends first.")
    # Per-request caps (ingress/request_size.py): over one, 400 naming it; never queued.
    max_n: Optional[int] = Field(None, ge=1, description="Most choices (`n`) one request may ask for.")
    max_prompts_per_request: Optional[int] = Field(
        None, ge=1, description="Most prompts in one completions request (a list `prompt` or `prompt_embeds`).",
    )
    max_tokens_per_request: Optional[int] = Field(
        None, ge=1,
        description="Highest max_tokens (max_completion_tokens) a request may ask for; a request that sets none "
        "runs with this as its max_tokens.",
    )
    max_sequences_per_request: Optional[int] = Field(
        None, ge=1,
        description="Most sequences (n x prompts) one request may run. Each sequence also holds one slot of "
        "max_concurrent_requests while it runs, so a request over that is refused too.",
    )

    # Per base model (issue 35): on top of the limits above, which hold across all bases.
    models: Optional[dict[str, BaseLimits]] = Field(
        None,
        description="Extra limits per base model name (requests_per_minute, tokens_per_minute, "
        "max_concurrent_requests, monthly_token_budget): a request on that base must fit them and the "
        "tenant-wide ones. A base not listed (or null) has no extra limit but its plan's.",
    )

    def over(self, plan: Optional["TenantLimits"]) -> "TenantLimits":
        """The limits in force: this tenant's own, and the plan's where the tenant set none
        (priority: the plan's while the tenant's is the default 0; per base, field by field)."""
        if plan is None:
            return self
        merged = _own_else_plan(self, plan, exclude={"models"})
        return TenantLimits.model_validate({**merged, "models": _models_over(self.models, plan.models)})

    def merged(self, changes: dict) -> "TenantLimits":
        """PATCH semantics: keys present in `changes` replace (null clears a limit), others stay;
        `models` merges per base and per field the same way ({"models": {"B": null}} clears B's)."""
        current = self.model_dump()
        if isinstance(changes.get("models"), dict):
            changes = {**changes, "models": _models_merged(current["models"] or {}, changes["models"])}
        return TenantLimits.model_validate({**current, **changes})

    def for_base(self, base_model: Optional[str]) -> Optional[BaseLimits]:
        """The extra limits on `base_model`; None: none set."""
        return (self.models or {}).get(base_model) if base_model is not None else None


def _own_else_plan(own: BaseModel, plan: BaseModel, exclude: Optional[set[str]] = None) -> dict[str, Any]:
    """Field by field, `own`'s value where it set one, else `plan`'s. A field at its default is
    not set: None (no limit of its own) or, for priority, 0."""
    defaults = {name: info.default for name, info in type(own).model_fields.items()}
    mine = own.model_dump(exclude=exclude)
    return {k: plan_v if mine[k] == defaults[k] else mine[k] for k, plan_v in plan.model_dump(exclude=exclude).items()}


def _models_over(mine: Optional[dict[str, BaseLimits]], plan: Optional[dict[str, BaseLimits]]):
    if not plan or not mine:
        return mine or plan
    return {base: mine[base].over(plan.get(base)) if base in mine else plan[base] for base in {**plan, **mine}}


def _models_merged(current: dict[str, dict], changes: dict[str, Any]) -> Optional[dict[str, Any]]:
    merged = dict(current)
    for base, change in changes.items():
        if change is None:
            merged.pop(base, None)
        elif isinstance(change, dict) and isinstance(merged.get(base), dict):
            merged[base] = {**merged[base], **change}
        else:  # new base (or not an object: validation names it)
            merged[base] = change
    return merged or None


# Names end up in URLs, logs, CSV exports and metric labels: keep them plain.
NAME_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,63}$"


class TenantCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(
        description="Unique tenant name: 1-64 of lowercase letters, digits, '.', '_', '-', "
        "starting with a letter or digit.",
    )
    plan: str = Field(DEFAULT_PLAN, min_length=1, max_length=64, description="Pricing plan name.")
    limits: TenantLimits = Field(default_factory=TenantLimits, description="Rate limits, budget, priority.")

    @field_validator("name")
    @classmethod
    def _plain_name(cls, name: str) -> str:
        if not re.fullmatch(NAME_PATTERN, name):
            raise ValueError(f"{name!r} is not a valid tenant name: use 1-64 lowercase letters, digits, "
                             "'.', '_' or '-', starting with a letter or digit (e.g. 'acme-prod')")
        return name


class TenantUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    plan: Optional[str] = Field(None, min_length=1, max_length=64, description="New pricing plan name.")
    limits: Optional[dict[str, Any]] = Field(
        None,
        description="Limits to change; keys left out keep their value, a null value clears the tenant's "
        "own (the plan's applies again, unlimited if the plan sets none).",
    )
    status: Optional[Literal["active", "suspended"]] = Field(
        None, description="'suspended' refuses the tenant's keys with 403: from the next request on the "
        "ingress replica that served the change, on every other one within tenancy.key_cache.refresh_s; "
        "'active' reactivates it (within the same bound).",
    )


@dataclass(frozen=True)
class Tenant:
    id: str
    name: str
    plan: str
    limits: TenantLimits
    status: str
    created_at: datetime
    updated_at: datetime

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id, "object": "tenant", "name": self.name, "plan": self.plan,
            "limits": self.limits.model_dump(), "status": self.status,
            "created_at": self.created_at.isoformat(), "updated_at": self.updated_at.isoformat(),
        }


@dataclass(frozen=True)
class ApiKey:
    """A key's record; the secret itself is never stored, only its sha256."""

    id: str
    tenant_id: str
    prefix: str
    created_at: datetime
    revoked_at: Optional[datetime] = None

    @property
    def revoked(self) -> bool:
        return self.revoked_at is not None

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id, "object": "api_key", "tenant_id": self.tenant_id, "prefix": self.prefix,
            "created_at": self.created_at.isoformat(), "revoked": self.revoked,
            "revoked_at": self.revoked_at.isoformat() if self.revoked_at else None,
        }


@dataclass(frozen=True)
class Principal:
    tenant_id: str
    tenant_name: str
    plan: str
    limits: TenantLimits
    key_id: str


# -- tables ---------------------------------------------------------------------------------------
tenants = Table(
    "tenants", Base.metadata,
    Column("id", String(64), primary_key=True),
    Column("name", String(64), nullable=False, unique=True),
    Column("plan", String(64), nullable=False),
    Column("limits", JSON, nullable=False),  # TenantLimits.model_dump(): every key, null = unlimited
    Column("status", String(16), nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    Column("updated_at", UTCDateTime, nullable=False),
    CheckConstraint("status IN ('active', 'suspended')", name="status"),
)

api_keys = Table(
    "api_keys", Base.metadata,
    Column("id", String(64), primary_key=True),
    Column("tenant_id", String(64), ForeignKey("tenants.id"), nullable=False),
    Column("prefix", String(32), nullable=False),
    # sha256 hex of the whole key; unique so authentication is one indexed lookup.
    Column("key_hash", String(64), nullable=False, unique=True),
    Column("created_at", UTCDateTime, nullable=False),
    Column("revoked_at", UTCDateTime),
    Index("ix_api_keys_tenant", "tenant_id"),
)


def _v1(conn):
    # Creates the tables as declared above; later versions must use explicit ALTERs.
    Base.metadata.create_all(conn, tables=[tenants, api_keys], checkfirst=True)


MIGRATIONS = [Migration("tenancy", 1, "tenants and api_keys", _v1)]
