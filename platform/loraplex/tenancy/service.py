"""TenantService: tenants and their API keys in the database; authenticates bearer keys.

Synchronous (SQLAlchemy); async callers run it in a thread. Nothing is cached here: every
`authenticate` reads the key and tenant rows (one indexed join). The ingress asks it through its
KeyCache (key_cache.py), which bounds how long a revocation or suspension takes to reach every
replica and keeps verified keys working through a database outage.
"""

from __future__ import annotations

import difflib
import types
from datetime import datetime, timezone
from typing import Any, Optional, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError
from sqlalchemy import Engine, Row, select
from sqlalchemy.exc import IntegrityError

from loraplex.accounting.config import DEFAULT_PLAN
from loraplex.db.engine import make_engine, write_transaction
from loraplex.db.migrations import migrate
from loraplex.errors import StatusError
from loraplex.tenancy.keys import KEY_SCHEME, MAX_KEY_CHARS, generate_key, hash_key, key_matches, key_prefix, new_id
from loraplex.tenancy.models import (
    MIGRATIONS, ApiKey, Principal, Tenant, TenantCreate, TenantLimits, TenantUpdate, api_keys, tenants,
)

WWW_AUTHENTICATE = {"WWW-Authenticate": "Bearer"}


class InvalidTenantField(StatusError):
    status = 400


class UnknownTenant(StatusError):
    status = 404


class UnknownKey(StatusError):
    status = 404


class DuplicateTenantName(StatusError):
    status = 409


class InvalidAPIKey(StatusError):
    """Missing, unknown or revoked key (401, with the Bearer challenge)."""

    status = 401
    headers = WWW_AUTHENTICATE


class TenantSuspended(StatusError):
    status = 403


_KEY_QUERY = (select(api_keys.c.id, api_keys.c.key_hash, api_keys.c.prefix, api_keys.c.revoked_at,
                     tenants.c.id.label("tenant_id"), tenants.c.name, tenants.c.plan, tenants.c.limits,
                     tenants.c.status)
              .join(tenants, tenants.c.id == api_keys.c.tenant_id))

MISSING_KEY = "Missing API key: send the header `Authorization: Bearer <your LoRAPlex API key>`."
INVALID_KEY = "Invalid API key: check that you copied the whole key, or ask your administrator for a new one."


def check_key_format(bearer_key: Optional[str]) -> None:
    """InvalidAPIKey (401) for a missing key or one that cannot be ours: no database needed."""
    if not bearer_key:
        raise InvalidAPIKey(MISSING_KEY)
    if len(bearer_key) > MAX_KEY_CHARS or not bearer_key.startswith(KEY_SCHEME):
        raise InvalidAPIKey(INVALID_KEY)


class TenantService:
    def __init__(self, engine: Engine, run_migrations: bool = True,
                 plans: Optional[dict[str, TenantLimits]] = None, known_plans: Optional[set[str]] = None,
                 known_bases: Optional[list[str]] = None):
        self.engine = engine
        # Plan name -> default limits (TenancyConfig.plans); applied to principals, not stored.
        self.plans = plans or {}
        # Plan names a tenant may be put on (limits or prices configured); None: any. A typo
        # would otherwise be stored and silently give the default plan's limits and prices.
        self.known_plans = known_plans
        # Base model names per-base limits may name (PlatformConfig.base_names); None: any. A
        # limit on a misspelt base would be stored and never apply.
        self.known_bases = known_bases
        if run_migrations:
            migrate(engine, MIGRATIONS)

    @classmethod
    def from_url(cls, db_url: str) -> "TenantService":
        return cls(make_engine(db_url))

    # -- tenants ------------------------------------------------------------------------------
    def create_tenant(self, name: str, plan: str = DEFAULT_PLAN, limits: TenantLimits | dict | None = None) -> Tenant:
        body = _validated(TenantCreate, {"name": name, "plan": plan, "limits": _as_dict(limits)})
        self._check_plan(body.plan)
        self._check_bases(body.limits.models or {})
        now = _now()
        row = {"id": new_id("ten"), "name": body.name, "plan": body.plan, "limits": body.limits.model_dump(),
               "status": "active", "created_at": now, "updated_at": now}
        try:
            with self._write() as conn:
                if conn.execute(select(tenants.c.id).where(tenants.c.name == body.name)).first():
                    raise _duplicate(body.name)
                conn.execute(tenants.insert().values(**row))
        except IntegrityError as e:  # a concurrent create of the same name won the race
            raise _duplicate(body.name) from e
        return _tenant(row)

    def _check_plan(self, plan: str) -> None:
        if self.known_plans is not None and plan not in self.known_plans:
            raise InvalidTenantField(f"plan: unknown plan {plan!r}; configured: {', '.join(sorted(self.known_plans))}. "
                                     "Add it under tenancy.plans (limits, weight) or accounting.pricing.plans (prices)")

    def _check_bases(self, per_base: dict) -> None:
        if self.known_bases is None:
            return
        unknown = sorted(set(per_base) - set(self.known_bases))
        if unknown:
            raise InvalidTenantField(f"limits.models: unknown base model {unknown[0]!r}; the bases are "
                                     f"{', '.join(self.known_bases)}. Name one of them, or add the base under "
                                     "`models:` in the config")

    def list_tenants(self) -> list[Tenant]:
        with self.engine.connect() as conn:
            return [_tenant(r._mapping) for r in conn.execute(select(tenants).order_by(tenants.c.created_at, tenants.c.id))]

    def get_tenant(self, tenant_id: str) -> Tenant:
        with self.engine.connect() as conn:
            return _tenant(self._tenant_row(conn, tenant_id)._mapping)

    def plan_of(self, tenant_id: str) -> Optional[str]:
        """For accounting's PriceBook(plan_of=...): None for an unknown tenant."""
        with self.engine.connect() as conn:
            return conn.execute(select(tenants.c.plan).where(tenants.c.id == tenant_id)).scalar()

    def update_tenant(self, tenant_id: str, plan: Optional[str] = None, limits: Optional[dict[str, Any]] = None,
                      status: Optional[str] = None) -> Tenant:
        """Change the plan, some limits (see TenantUpdate), or suspend / reactivate."""
        body = _validated(TenantUpdate, {"plan": plan, "limits": _as_dict(limits), "status": status})
        if body.plan is not None:
            self._check_plan(body.plan)
        if body.limits is not None and isinstance(body.limits.get("models"), dict):
            # Only the bases this change sets: one stored before its base left the config must not
            # block an unrelated change (it applies to nothing; null clears it).
            self._check_bases({b: v for b, v in body.limits["models"].items() if v is not None})
        with self._write() as conn:
            current = _tenant(self._tenant_row(conn, tenant_id, for_update=True)._mapping)
            changes: dict[str, Any] = {}
            if body.plan is not None:
                changes["plan"] = body.plan
            if body.limits is not None:
                try:
                    changes["limits"] = current.limits.merged(body.limits).model_dump()
                except ValidationError as e:
                    raise InvalidTenantField(_first_error(e, TenantLimits, "limits")) from e
            if body.status is not None:
                changes["status"] = body.status
            if not changes:
                return current
            changes["updated_at"] = _now()
            conn.execute(tenants.update().where(tenants.c.id == tenant_id).values(**changes))
            row = {**_raw(current), **changes}
        return _tenant(row)

    # -- keys ---------------------------------------------------------------------------------
    def issue_key(self, tenant_id: str) -> tuple[ApiKey, str]:
        """A new key for the tenant: (its record, the plaintext). The plaintext is not kept."""
        key = generate_key()
        record = ApiKey(id=new_id("key"), tenant_id=tenant_id, prefix=key_prefix(key), created_at=_now())
        with self._write() as conn:
            self._tenant_row(conn, tenant_id)
            conn.execute(api_keys.insert().values(
                id=record.id, tenant_id=tenant_id, prefix=record.prefix, key_hash=hash_key(key),
                created_at=record.created_at))
        return record, key

    def list_keys(self, tenant_id: str) -> list[ApiKey]:
        with self.engine.connect() as conn:
            self._tenant_row(conn, tenant_id)
            rows = conn.execute(select(api_keys).where(api_keys.c.tenant_id == tenant_id)
                                .order_by(api_keys.c.created_at, api_keys.c.id))
            return [_key(r._mapping) for r in rows]

    def revoke_key(self, key_id: str) -> ApiKey:
        """Idempotent: revoking a revoked key keeps its first revocation time."""
        with self._write() as conn:
            row = conn.execute(select(api_keys).where(api_keys.c.id == key_id).with_for_update()).first()
            if row is None:
                raise UnknownKey(f"No API key with id {key_id!r}; list a tenant's keys with "
                                 "GET /admin/tenants/{tenant_id}/keys.")
            if row.revoked_at is not None:
                return _key(row._mapping)
            now = _now()
            conn.execute(api_keys.update().where(api_keys.c.id == key_id).values(revoked_at=now))
            return _key({**row._mapping, "revoked_at": now})

    # -- authentication -----------------------------------------------------------------------
    def authenticate(self, bearer_key: Optional[str]) -> Principal:
        """The caller's principal; InvalidAPIKey (401) or TenantSuspended (403) otherwise."""
        check_key_format(bearer_key)
        with self.engine.connect() as conn:
            row = conn.execute(_KEY_QUERY.where(api_keys.c.key_hash == hash_key(bearer_key))).first()
        # The lookup is by digest, so its timing reveals nothing about the key; the constant-time
        # compare is a second guard in case a future lookup matches on less than the full digest.
        if row is None or not key_matches(bearer_key, row.key_hash):
            raise InvalidAPIKey(INVALID_KEY)
        return self._principal(row)

    def principals_by_hash(self, key_hashes: list[str]) -> dict[str, Principal | StatusError]:
        """For the key cache's refresh: each known digest's principal, or the error authenticating
        it would raise now (revoked: InvalidAPIKey, suspended: TenantSuspended). Unknown digests
        are absent. One query per 500 digests."""
        out: dict[str, Principal | StatusError] = {}
        with self.engine.connect() as conn:
            for i in range(0, len(key_hashes), 500):
                for row in conn.execute(_KEY_QUERY.where(api_keys.c.key_hash.in_(key_hashes[i:i + 500]))):
                    try:
                        out[row.key_hash] = self._principal(row)
                    except StatusError as e:
                        out[row.key_hash] = e
        return out

    def ping(self) -> None:
        """One round trip to the database (raises what the driver raises when it is down)."""
        with self.engine.connect() as conn:
            conn.execute(select(1))

    def _principal(self, row) -> Principal:
        if row.revoked_at is not None:
            raise InvalidAPIKey(f"API key {row.prefix}... was revoked; ask your administrator for a new key.")
        if row.status != "active":
            raise TenantSuspended(f"Tenant {row.name!r} is suspended; ask your administrator to reactivate it.")
        return Principal(tenant_id=row.tenant_id, tenant_name=row.name, plan=row.plan,
                         limits=self.effective_limits(row.plan, TenantLimits.model_validate(row.limits)),
                         key_id=row.id)

    def effective_limits(self, plan: str, own: TenantLimits) -> TenantLimits:
        """The tenant's own limits over its plan's defaults (the default plan's if its plan has none)."""
        return own.over(self.plans.get(plan, self.plans.get(DEFAULT_PLAN)))

    # -- helpers ------------------------------------------------------------------------------
    def _write(self):
        # BEGIN IMMEDIATE on SQLite (the Postgres path ignores it): read-modify-write stays atomic.
        return write_transaction(self.engine)

    def _tenant_row(self, conn, tenant_id: str, for_update: bool = False) -> Row:
        query = select(tenants).where(tenants.c.id == tenant_id)
        row = conn.execute(query.with_for_update() if for_update else query).first()
        if row is None:
            raise UnknownTenant(f"No tenant with id {tenant_id!r}; list tenants with GET /admin/tenants.")
        return row




def _now() -> datetime:
    return datetime.now(timezone.utc)


def _as_dict(limits):
    return limits.model_dump(exclude_unset=True) if isinstance(limits, TenantLimits) else limits


def _validated(model, data: dict[str, Any]):
    try:
        return model.model_validate({k: v for k, v in data.items() if v is not None})
    except ValidationError as e:
        raise InvalidTenantField(_first_error(e, model)) from e


def _first_error(e: ValidationError, model: type[BaseModel], root: str | None = None) -> str:
    """The first error of validating `model` (reached at `root` of the request body), as
    "where: what"; an unknown field also gets the closest valid name and the valid ones."""
    first = e.errors()[0]
    loc = ".".join(str(p) for p in ((root,) if root else ()) + tuple(first.get("loc", ())))
    msg = first.get("msg", str(e))
    if first.get("type") == "extra_forbidden" and first.get("loc"):
        *path, name = first["loc"]
        valid = _fields_at(model, path)
        close = difflib.get_close_matches(str(name), valid, n=1)
        msg += (f"; did you mean `{close[0]}`?" if close else ";") + f" valid fields: {', '.join(valid)}"
    return f"{loc}: {msg}" if loc else msg


def _fields_at(annotation: Any, path: list) -> list[str]:
    """The field names of the model found at `path` (field names, a dict's keys) inside `annotation`."""
    if get_origin(annotation) in (Union, types.UnionType):  # Optional[X]: X
        annotation = next((a for a in get_args(annotation) if a is not type(None)), None)
    if get_origin(annotation) is dict:
        return _fields_at(get_args(annotation)[1], path[1:]) if path else []
    if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
        return []
    if not path:
        return list(annotation.model_fields)
    field_info = annotation.model_fields.get(path[0])
    return _fields_at(field_info.annotation, path[1:]) if field_info is not None else []


def _duplicate(name: str) -> DuplicateTenantName:
    return DuplicateTenantName(f"A tenant named {name!r} already exists; pick another name "
                               "or manage the existing one via GET /admin/tenants.")


def _tenant(m) -> Tenant:
    return Tenant(id=m["id"], name=m["name"], plan=m["plan"], limits=TenantLimits.model_validate(m["limits"]),
                  status=m["status"], created_at=m["created_at"], updated_at=m["updated_at"])


def _raw(t: Tenant) -> dict[str, Any]:
    return {"id": t.id, "name": t.name, "plan": t.plan, "limits": t.limits.model_dump(), "status": t.status,
            "created_at": t.created_at, "updated_at": t.updated_at}


def _key(m) -> ApiKey:
    return ApiKey(id=m["id"], tenant_id=m["tenant_id"], prefix=m["prefix"], created_at=m["created_at"],
                  revoked_at=m["revoked_at"])
