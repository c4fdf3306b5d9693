"""AdapterCatalog: every adapter version in the database, the one authority on versions.

It numbers versions (1, 2, ... per tenant and name, never reused, even after a delete), resolves
`name`, `name@N` and `name@<sha256>` for a tenant, lists and deletes them. The store only holds
the weights, by sha256. The row's integer id is the version's `lora_int_id` in vLLM: it must be
the same on every engine replica and never reused, which Python's hash() or a per-process
counter are not. Engines ask "which loaded versions were deleted" in one query, and keep the
answer: so a delete is final for its row. The same weights uploaded again after a delete are a
new version (a new number and id), which every replica loads as new whether or not it has seen
the delete yet; reviving the old row would need every replica to forget that it was deleted.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone

from sqlalchemy import (JSON, BigInteger, Column, Connection, Engine, Index, Integer, String, Table,
                        UniqueConstraint, func, select, text, update)
from sqlalchemy.exc import IntegrityError

from loraplex.db.base import Base
from loraplex.db.engine import write_transaction
from loraplex.db.migrations import Migration, migrate
from loraplex.db.types import UTCDateTime
from loraplex.registry.store import NAME, AdapterNotFound

adapter_versions = Table(
    "adapter_versions", Base.metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),  # = vLLM lora_int_id
    Column("tenant_id", String(64), nullable=False),
    Column("name", String(64), nullable=False),
    Column("version", Integer, nullable=False),
    Column("sha256", String(64), nullable=False),
    Column("rank", Integer, nullable=False),
    Column("target_modules", JSON, nullable=False),
    Column("base_model", String(200)),
    Column("size_bytes", BigInteger, nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    Column("deleted_at", UTCDateTime),
    Column("pinned_at", UTCDateTime),  # an operator pinned it: every replica keeps it in vLLM's CPU tier
    # Named here: the convention's uq_<table>_<first column> would give both the same name,
    # which Postgres refuses.
    UniqueConstraint("tenant_id", "name", "version", name="uq_adapter_versions_tenant_name_version"),
    Index("ix_adapter_versions_tenant_name", "tenant_id", "name"),
    # One live version per weights and name; deleted rows keep theirs (a re-upload is a new row).
    Index("uq_adapter_versions_live_sha256", "tenant_id", "name", "sha256", unique=True,
          sqlite_where=text("deleted_at IS NULL"), postgresql_where=text("deleted_at IS NULL")),
)
_OLD_SHA_CONSTRAINT = "uq_adapter_versions_tenant_name_sha256"  # registry v1: over deleted rows too


def _sha_unique_among_live_rows(conn: Connection) -> None:
    """registry v2: (tenant, name, sha256) unique among live rows only, so the same weights can
    come back after a delete as a new version."""
    if conn.dialect.name == "sqlite":
        sql = conn.execute(text("SELECT sql FROM sqlite_master WHERE type='table' AND name='adapter_versions'"))
        if _OLD_SHA_CONSTRAINT in (sql.scalar() or ""):  # SQLite drops a constraint by rebuilding
            conn.execute(text("DROP INDEX IF EXISTS ix_adapter_versions_tenant_name"))
            conn.execute(text("ALTER TABLE adapter_versions RENAME TO adapter_versions_v1"))
            adapter_versions.create(conn)
            columns = ", ".join(c.name for c in adapter_versions.columns)
            conn.execute(text(f"INSERT INTO adapter_versions ({columns}) SELECT {columns} FROM adapter_versions_v1"))
            conn.execute(text("DROP TABLE adapter_versions_v1"))
    else:
        conn.execute(text(f"ALTER TABLE adapter_versions DROP CONSTRAINT IF EXISTS {_OLD_SHA_CONSTRAINT}"))
    for index in adapter_versions.indexes:
        index.create(conn, checkfirst=True)


def _add_pinned_at(conn: Connection) -> None:
    """registry v3: adapter_versions.pinned_at (a v1 table made before it has no such column)."""
    from sqlalchemy import inspect

    if "pinned_at" not in {c["name"] for c in inspect(conn).get_columns("adapter_versions")}:
        column = adapter_versions.c.pinned_at
        conn.execute(text(f"ALTER TABLE adapter_versions ADD COLUMN pinned_at {column.type.compile(conn.dialect)}"))


MIGRATIONS = [
    Migration("registry", 1, "adapter_versions", lambda conn: adapter_versions.create(conn, checkfirst=True)),
    Migration("registry", 2, "adapter sha unique among live versions", _sha_unique_among_live_rows),
    Migration("registry", 3, "adapter_versions.pinned_at", _add_pinned_at),
]
ADD_ATTEMPTS = 5  # concurrent uploads to one name on Postgres: the loser of a unique key retries


@dataclass(frozen=True)
class AdapterVersion:
    """One immutable, content-addressed version of a tenant's adapter."""

    id: int  # the catalog row: vLLM's lora_int_id
    tenant: str
    name: str
    version: int  # 1, 2, ... per (tenant, name); never reused, even after delete
    sha256: str  # the store's key of the weights
    rank: int
    target_modules: list[str]
    base_model: str | None  # the adapter's own claim; the validator checked the real fit
    size_bytes: int
    created_at: str  # ISO-8601 UTC
    pinned: bool = False  # kept in every replica's CPU tier (AdapterCatalog.pin)

    @property
    def lora_name(self) -> str:
        # vLLM keys its prefix cache by LoRA name: the sha keeps a name bound to one set of
        # weights, the number to one version (the same weights re-uploaded after a delete are
        # another version, with another lora_int_id, loaded as its own vLLM LoRA).
        return f"{self.tenant}/{self.name}@{self.version}:{self.sha256}"

    def to_response(self) -> dict:
        """The body of `POST /v1/adapters` (201) and one entry of the adapter listings."""
        body = asdict(self)
        del body["id"], body["tenant"]
        return body


def group_by_name(versions: list[AdapterVersion]) -> dict[str, list[AdapterVersion]]:
    """Versions per adapter name, keeping their order (AdapterCatalog.list: by name, then version)."""
    groups: dict[str, list[AdapterVersion]] = {}
    for v in versions:
        groups.setdefault(v.name, []).append(v)
    return groups


def parse_ref(ref: str) -> tuple[str, str | None]:
    """`name` -> (name, None); `name@3` or `name@<sha256>` -> (name, "3" / sha)."""
    name, _, version = ref.partition("@")
    return name, (version or None)


class AdapterCatalog:
    def __init__(self, engine: Engine):
        self.engine = engine
        migrate(engine, MIGRATIONS)

    def add(self, tenant: str, name: str, sha256: str, *, rank: int, target_modules: list[str],
            base_model: str | None, size_bytes: int, quota=None, ensure_blob=None) -> AdapterVersion:
        """The version of `name` holding these weights: the live one if they are already there,
        else a new number and id (also when a deleted version had them: see the module's doc).
        `quota` (registry.quota.AdapterQuota): checked in the same transaction as the insert.
        `ensure_blob()`: run in that transaction, under the tenant's lock (see `delete`), after
        the insert: the weights are in the store when the row commits, or neither is."""
        attempts = ADD_ATTEMPTS
        while True:
            try:
                return self._add(tenant, name, sha256, quota, ensure_blob, rank=rank,
                                 target_modules=list(target_modules), base_model=base_model, size_bytes=size_bytes)
            except IntegrityError:
                attempts -= 1
                if not attempts:
                    raise

    def _add(self, tenant: str, name: str, sha256: str, quota, ensure_blob, **facts) -> AdapterVersion:
        t = adapter_versions
        now = datetime.now(timezone.utc)
        with write_transaction(self.engine) as conn:
            _lock_tenant(conn, tenant)
            row = conn.execute(select(t).where(t.c.tenant_id == tenant, t.c.name == name, t.c.sha256 == sha256,
                                               t.c.deleted_at.is_(None))).first()
            if row is not None:
                return _version(row)
            if quota is not None:
                quota.check(*self._usage(conn, tenant), new_bytes=facts["size_bytes"])
            last = conn.execute(
                select(func.max(t.c.version)).where(t.c.tenant_id == tenant, t.c.name == name)
            ).scalar()
            values = dict(tenant_id=tenant, name=name, version=(last or 0) + 1, sha256=sha256, created_at=now,
                          **facts)
            result = conn.execute(t.insert().values(**values))
            if ensure_blob is not None:
                ensure_blob()
            return _version(values | {"id": result.inserted_primary_key[0]})

    def usage(self, tenant: str) -> tuple[int, int]:
        """(live versions, their bytes) of a tenant: what its adapter quota counts."""
        with self.engine.connect() as conn:
            return self._usage(conn, tenant)

    @staticmethod
    def _usage(conn: Connection, tenant: str) -> tuple[int, int]:
        t = adapter_versions
        count, size = conn.execute(select(func.count(), func.coalesce(func.sum(t.c.size_bytes), 0)).where(
            t.c.tenant_id == tenant, t.c.deleted_at.is_(None))).one()
        return int(count), int(size)

    def resolve(self, tenant: str, ref: str) -> AdapterVersion:
        """The live version `ref` names for this tenant; another tenant's adapter is just missing."""
        name, version = parse_ref(ref)
        t = adapter_versions
        query = select(t).where(t.c.tenant_id == tenant, t.c.name == name, t.c.deleted_at.is_(None))
        if version is None:
            query = query.order_by(t.c.version.desc()).limit(1)
        elif version.isascii() and version.isdigit():
            # A number no column can hold names no version (and would overflow the database's integer).
            query = query.where(t.c.version == int(version)) if len(version) <= 18 else None
        else:
            query = query.where(t.c.sha256 == version)
        row = None
        if query is not None and NAME.fullmatch(name):
            with self.engine.connect() as conn:
                row = conn.execute(query).first()
        if row is None:
            raise AdapterNotFound(f"The model `{ref}` does not exist. List yours with GET /v1/models.")
        return _version(row)

    def list(self, tenant: str) -> list[AdapterVersion]:
        """The tenant's live versions, by name, then version."""
        t = adapter_versions
        query = select(t).where(t.c.tenant_id == tenant, t.c.deleted_at.is_(None)).order_by(t.c.name, t.c.version)
        with self.engine.connect() as conn:
            return [_version(row) for row in conn.execute(query)]

    def delete(self, tenant: str, ref: str, on_unused=None) -> list[AdapterVersion]:
        """Mark `name` (every version) or `name@v` deleted; new requests for it 404 from now on.

        `on_unused(sha256)`: called for each of their weights no live version of the tenant uses
        any more, inside the same transaction, under the tenant's lock: an upload of the same
        weights (`add`) runs wholly before it (its row keeps the blob) or wholly after (it finds
        the blob gone and puts it again), never between the check and the removal. A failing
        on_unused does not undo the delete (the versions are gone; their blob is incomplete and
        invisible): its error is raised after the commit."""
        name, version = parse_ref(ref)
        versions = [self.resolve(tenant, ref)] if version else group_by_name(self.list(tenant)).get(name, [])
        if not versions:
            raise AdapterNotFound(f"The adapter `{ref}` does not exist.")
        with write_transaction(self.engine) as conn:
            _lock_tenant(conn, tenant)
            conn.execute(update(adapter_versions).where(adapter_versions.c.id.in_([v.id for v in versions]))
                         .values(deleted_at=datetime.now(timezone.utc)))
            failure = self._release(conn, tenant, {v.sha256 for v in versions}, on_unused)
        if failure is not None:
            raise failure
        return versions

    def release_if_unused(self, tenant: str, sha256: str, on_unused) -> None:
        """on_unused(sha256) unless a live version of the tenant uses these weights, under the
        tenant's lock (an upload that put a blob and then failed to add its row cleans up here)."""
        with write_transaction(self.engine) as conn:
            _lock_tenant(conn, tenant)
            failure = self._release(conn, tenant, {sha256}, on_unused)
        if failure is not None:
            raise failure

    @staticmethod
    def _release(conn: Connection, tenant: str, shas: set[str], on_unused) -> BaseException | None:
        if on_unused is None:
            return None
        t = adapter_versions
        for sha256 in sorted(shas):
            used = conn.execute(select(t.c.id).where(t.c.tenant_id == tenant, t.c.sha256 == sha256,
                                                     t.c.deleted_at.is_(None)).limit(1)).first()
            if used is None:
                try:
                    on_unused(sha256)
                except Exception as exc:  # noqa: BLE001 (raised after the commit)
                    return exc
        return None

    def pin(self, tenant: str, ref: str, pinned: bool,
            max_pinned: int | Mapping[str, int] | None = None) -> AdapterVersion:
        """Pin (or unpin) the live version `ref` names. At most `max_pinned` versions of its base
        model are pinned at once across tenants (each takes CPU-tier room on every replica of that
        base's pool; a mapping gives each base's bound): over it, 409."""
        from loraplex.errors import StatusError

        version = self.resolve(tenant, ref)
        if isinstance(max_pinned, Mapping):
            max_pinned = max_pinned.get(version.base_model)
        t = adapter_versions
        with write_transaction(self.engine) as conn:
            if pinned and not version.pinned and max_pinned is not None:
                count = conn.execute(select(func.count()).select_from(t).where(
                    t.c.pinned_at.is_not(None), t.c.deleted_at.is_(None), t.c.base_model == version.base_model)).scalar()
                if count >= max_pinned:
                    raise StatusError(f"{count} adapter versions are pinned already, the most this deployment "
                                      f"keeps ({max_pinned}: engine.max_cpu_loras - 1, so one CPU-tier place stays "
                                      "free for the rest); unpin one (DELETE .../pin) or raise max_cpu_loras",
                                      status=409, type="conflict")
            conn.execute(update(t).where(t.c.id == version.id).values(
                pinned_at=datetime.now(timezone.utc) if pinned else None))
        return replace(version, pinned=pinned)

    def pinned(self, base_model: str | None = None) -> list[AdapterVersion]:
        """Every tenant's pinned live versions (of `base_model` only, if given: what one pool's
        replicas keep loaded), first pinned first."""
        t = adapter_versions
        query = select(t).where(t.c.pinned_at.is_not(None), t.c.deleted_at.is_(None))
        if base_model is not None:
            query = query.where(t.c.base_model == base_model)
        query = query.order_by(t.c.pinned_at, t.c.id)
        with self.engine.connect() as conn:
            return [_version(row) for row in conn.execute(query)]

    def sha_in_use(self, tenant: str, sha256: str) -> bool:
        """Whether a live version of this tenant (under any name) has these weights: its blob stays."""
        t = adapter_versions
        query = select(t.c.id).where(t.c.tenant_id == tenant, t.c.sha256 == sha256, t.c.deleted_at.is_(None))
        with self.engine.connect() as conn:
            return conn.execute(query.limit(1)).first() is not None

    def deleted_among(self, ids: list[int]) -> set[int]:
        """Which of these (loaded) versions have been deleted since: engines poll this to free them."""
        if not ids:
            return set()
        t = adapter_versions
        with self.engine.connect() as conn:
            rows = conn.execute(select(t.c.id).where(t.c.id.in_(ids), t.c.deleted_at.is_not(None)))
            return {row.id for row in rows}


def _lock_tenant(conn: Connection, tenant: str) -> None:
    """Serialize this tenant's adapter writes (add, delete) for the transaction. SQLite's
    write_transaction (BEGIN IMMEDIATE) already serializes every writer; PostgreSQL's default
    isolation does not, so an advisory lock per tenant, released at commit or rollback."""
    if conn.dialect.name == "postgresql":
        key = int.from_bytes(hashlib.sha256(f"loraplex-adapters:{tenant}".encode()).digest()[:8], "big", signed=True)
        conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": key})


def _version(row) -> AdapterVersion:
    m = row if isinstance(row, dict) else row._mapping
    return AdapterVersion(
        id=m["id"], tenant=m["tenant_id"], name=m["name"], version=m["version"], sha256=m["sha256"],
        rank=m["rank"], target_modules=list(m["target_modules"]), base_model=m["base_model"],
        size_bytes=m["size_bytes"],
        created_at=m["created_at"].isoformat(timespec="seconds").replace("+00:00", "Z"),
        pinned=m.get("pinned_at") is not None,
    )
