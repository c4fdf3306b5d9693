"""Tiny ordered migrations: (component, version) rows in `schema_version`.

Each component (accounting, tenancy, registry, ...) owns its own version sequence, so teams add
migrations without coordinating numbers. Alembic would be worth it once autogenerate and
downgrades matter; today forward-only functions are enough.
"""
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Callable, Iterable

from sqlalchemy import Column, Connection, Engine, Integer, MetaData, String, Table, select, text

from loraplex.db.types import UTCDateTime

# Its own MetaData: the bookkeeping table must exist before any component's tables.
_meta = MetaData()
schema_version = Table(
    "schema_version", _meta,
    Column("component", String(64), primary_key=True),
    Column("version", Integer, primary_key=True),
    Column("name", String(200), nullable=False),
    Column("applied_at", UTCDateTime, nullable=False),
)

# Any constant works; it only has to be the same in every process of the deployment.
_PG_LOCK_KEY = 0x4C4F5241  # "LORA"


@dataclass(frozen=True)
class Migration:
    component: str
    version: int
    name: str
    apply: Callable[[Connection], None]  # runs inside the migration's transaction


def migrate(engine: Engine, migrations: Iterable[Migration]) -> list[Migration]:
    """Apply the not-yet-applied migrations in version order; return those applied.

    Safe to call from many replicas at once: Postgres takes an advisory lock, SQLite BEGIN
    IMMEDIATE; both make the check-then-apply atomic.
    """
    ordered = sorted(migrations, key=lambda m: (m.component, m.version))
    done: list[Migration] = []
    with engine.connect().execution_options(sqlite_begin="BEGIN IMMEDIATE") as conn:
        with conn.begin():
            if conn.dialect.name == "postgresql":
                conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _PG_LOCK_KEY})
            _meta.create_all(conn, checkfirst=True)
            applied = _applied(conn)
            for m in ordered:
                if m.version in applied.get(m.component, set()):
                    continue
                m.apply(conn)
                conn.execute(schema_version.insert().values(
                    component=m.component, version=m.version, name=m.name,
                    applied_at=datetime.now(timezone.utc)))
                done.append(m)
    return done


def applied_versions(engine: Engine) -> dict[str, set[int]]:
    with engine.connect() as conn:
        if not engine.dialect.has_table(conn, "schema_version"):
            return {}
        return _applied(conn)


def _applied(conn: Connection) -> dict[str, set[int]]:
    out: dict[str, set[int]] = {}
    for component, version in conn.execute(select(schema_version.c.component, schema_version.c.version)):
        out.setdefault(component, set()).add(version)
    return out
