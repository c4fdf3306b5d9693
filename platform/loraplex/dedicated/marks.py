"""Admin marks: adapter versions an operator made dedicated with PUT
/admin/tenants/{id}/adapters/{ref}/dedicated, one row per version (its catalog id).

The app reads them when it is built (targets.py: a dedicated Engine deployment each) and every
ingress replica re-reads them every `dedicated.health_poll_s`, so a DELETE stops the merged path
at once on the replica that took it and within that period on the others.
"""

from __future__ import annotations

from datetime import datetime, timezone

from sqlalchemy import Column, Engine, Integer, String, Table, delete, select

from loraplex.db.base import Base
from loraplex.db.engine import write_transaction
from loraplex.db.migrations import Migration, migrate
from loraplex.db.types import UTCDateTime
from loraplex.registry.catalog import AdapterVersion, _version, adapter_versions

dedicated_marks = Table(
    "dedicated_marks", Base.metadata,
    Column("adapter_version_id", Integer, primary_key=True),  # adapter_versions.id: one version
    Column("tenant_id", String(64), nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
)

MIGRATIONS = [Migration("dedicated", 1, "dedicated_marks",
                        lambda conn: dedicated_marks.create(conn, checkfirst=True))]


class DedicatedMarks:
    def __init__(self, engine: Engine):
        self.engine = engine
        migrate(engine, MIGRATIONS)

    def put(self, version: AdapterVersion) -> bool:
        """Mark this version dedicated; False if it already was."""
        with write_transaction(self.engine) as conn:
            t = dedicated_marks
            if conn.execute(select(t.c.adapter_version_id).where(t.c.adapter_version_id == version.id)).first():
                return False
            conn.execute(t.insert().values(adapter_version_id=version.id, tenant_id=version.tenant,
                                           created_at=datetime.now(timezone.utc)))
            return True

    def delete(self, adapter_version_id: int) -> bool:
        """Unmark it; False if it was not marked."""
        with write_transaction(self.engine) as conn:
            t = dedicated_marks
            return conn.execute(delete(t).where(t.c.adapter_version_id == adapter_version_id)).rowcount > 0

    def live(self) -> list[AdapterVersion]:
        """The marked versions that are not deleted (a deleted version's mark is retired with it)."""
        a, t = adapter_versions, dedicated_marks
        query = (select(a).join(t, t.c.adapter_version_id == a.c.id).where(a.c.deleted_at.is_(None))
                 .order_by(a.c.id))
        with self.engine.connect() as conn:
            return [_version(row) for row in conn.execute(query)]

    def live_ids(self) -> set[int]:
        return {v.id for v in self.live()}
