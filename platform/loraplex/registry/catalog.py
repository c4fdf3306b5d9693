"""AdapterCatalog: the database row of every adapter version, the authority engines and ingress share.

The row's integer id is the version's `lora_int_id` in vLLM: it must be the same on every engine
replica and never reused for other weights, which Python's hash() or a per-process counter are
not. The store holds the weights; the catalog answers "which version does `name@v` mean for this
tenant" and "which loaded versions were deleted" in one indexed query.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

from sqlalchemy import JSON, BigInteger, Column, Engine, Index, Integer, String, Table, UniqueConstraint, select, update

from loraplex.db import Base, Migration, UTCDateTime, migrate, write_transaction
from loraplex.registry.errors import AdapterNotFound
from loraplex.registry.version import AdapterVersion

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
    UniqueConstraint("tenant_id", "name", "version"),
    UniqueConstraint("tenant_id", "name", "sha256"),
    Index("ix_adapter_versions_tenant_name", "tenant_id", "name"),
)

MIGRATIONS = [
    Migration("registry", 1, "adapter_versions", lambda conn: adapter_versions.create(conn, checkfirst=True)),
]


@dataclass(frozen=True)
class CatalogEntry:
    id: int
    version: AdapterVersion

    @property
    def lora_name(self) -> str:
        return self.version.lora_name

    def to_response(self) -> dict:
        return self.version.to_response()


def group_by_name(entries: list[CatalogEntry]) -> dict[str, list[CatalogEntry]]:
    """Entries per adapter name, keeping their order (AdapterCatalog.list: by name, then version)."""
    groups: dict[str, list[CatalogEntry]] = {}
    for entry in entries:
        groups.setdefault(entry.version.name, []).append(entry)
    return groups


def parse_ref(ref: str) -> tuple[str, str | None]:
    """`name` -> (name, None); `name@3` or `name@<sha256>` -> (name, "3" / sha)."""
    name, _, version = ref.partition("@")
    return name, (version or None)


class AdapterCatalog:
    def __init__(self, engine: Engine):
        self.engine = engine
        migrate(engine, MIGRATIONS)

    def record(self, v: AdapterVersion) -> CatalogEntry:
        """Insert a stored version; the same weights again (even after a delete) keep their id."""
        t = adapter_versions
        with write_transaction(self.engine) as conn:
            row = conn.execute(
                select(t.c.id).where(t.c.tenant_id == v.tenant, t.c.name == v.name, t.c.sha256 == v.sha256)
            ).first()
            if row is not None:
                conn.execute(update(t).where(t.c.id == row.id).values(deleted_at=None))
                return CatalogEntry(row.id, v)
            result = conn.execute(t.insert().values(
                tenant_id=v.tenant, name=v.name, version=v.version, sha256=v.sha256, rank=v.rank,
                target_modules=list(v.target_modules), base_model=v.base_model, size_bytes=v.size_bytes,
                created_at=_parse_time(v.created_at),
            ))
            return CatalogEntry(result.inserted_primary_key[0], v)

    def resolve(self, tenant: str, ref: str) -> CatalogEntry:
        """The live version `ref` names for this tenant; another tenant's adapter is just missing."""
        name, version = parse_ref(ref)
        t = adapter_versions
        query = select(t).where(t.c.tenant_id == tenant, t.c.name == name, t.c.deleted_at.is_(None))
        if version is None:
            query = query.order_by(t.c.version.desc()).limit(1)
        elif version.isdigit():
            query = query.where(t.c.version == int(version))
        else:
            query = query.where(t.c.sha256 == version)
        with self.engine.connect() as conn:
            row = conn.execute(query).first()
        if row is None:
            raise AdapterNotFound(f"The model `{ref}` does not exist. List yours with GET /v1/models.")
        return _entry(row)

    def list(self, tenant: str) -> list[CatalogEntry]:
        t = adapter_versions
        query = select(t).where(t.c.tenant_id == tenant, t.c.deleted_at.is_(None)).order_by(t.c.name, t.c.version)
        with self.engine.connect() as conn:
            return [_entry(row) for row in conn.execute(query)]

    def delete(self, tenant: str, ref: str) -> list[CatalogEntry]:
        """Mark `name` (every version) or `name@v` deleted; new requests for it 404 from now on."""
        name, version = parse_ref(ref)
        entries = [self.resolve(tenant, ref)] if version else group_by_name(self.list(tenant)).get(name, [])
        if not entries:
            raise AdapterNotFound(f"The adapter `{ref}` does not exist.")
        ids = [e.id for e in entries]
        with write_transaction(self.engine) as conn:
            conn.execute(update(adapter_versions).where(adapter_versions.c.id.in_(ids))
                         .values(deleted_at=datetime.now(timezone.utc)))
        return entries

    def deleted_among(self, ids: list[int]) -> set[int]:
        """Which of these (loaded) versions have been deleted since: engines poll this to free them."""
        if not ids:
            return set()
        t = adapter_versions
        with self.engine.connect() as conn:
            rows = conn.execute(select(t.c.id).where(t.c.id.in_(ids), t.c.deleted_at.is_not(None)))
            return {row.id for row in rows}


def _parse_time(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def _entry(row) -> CatalogEntry:
    return CatalogEntry(row.id, AdapterVersion(
        tenant=row.tenant_id, name=row.name, version=row.version, sha256=row.sha256, rank=row.rank,
        target_modules=list(row.target_modules), base_model=row.base_model, size_bytes=row.size_bytes,
        created_at=row.created_at.isoformat(timespec="seconds").replace("+00:00", "Z"),
    ))
