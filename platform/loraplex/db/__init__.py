"""Database plumbing shared by the platform: engine factory, metadata, migrations."""
from loraplex.db.base import Base
from loraplex.db.engine import DEFAULT_DB_URL, make_engine, session_factory, write_transaction
from loraplex.db.migrations import Migration, applied_versions, migrate
from loraplex.db.types import UTCDateTime
from loraplex.db.unavailable import StoreUnavailable, is_unavailable

__all__ = [
    "Base", "DEFAULT_DB_URL", "make_engine", "session_factory", "write_transaction",
    "Migration", "applied_versions", "migrate", "UTCDateTime", "StoreUnavailable", "is_unavailable",
]
