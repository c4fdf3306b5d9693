"""Quality runs and the operator's overrides of the gate."""

from sqlalchemy import JSON, Boolean, Column, Index, String, Table, Text

from loraplex.db.base import Base
from loraplex.db.migrations import Migration
from loraplex.db.types import UTCDateTime

quality_runs = Table(
    "quality_runs", Base.metadata,
    Column("id", String(64), primary_key=True),  # qrun_<hex>
    Column("tenant_id", String(64), nullable=False),
    Column("api_key_id", String(64)),
    Column("status", String(16), nullable=False),  # runner.py: queued, generating, scoring, completed, failed
    Column("endpoint", String(64), nullable=False),
    Column("input_file_id", String(64), nullable=False),
    # The models as the tenant named them, and what they resolved to (the gate matches on these).
    Column("reference", String(300), nullable=False),
    Column("candidate", String(300), nullable=False),
    Column("reference_base", String(200), nullable=False),
    Column("reference_adapter", String(128)),
    Column("candidate_base", String(200), nullable=False),
    Column("candidate_adapter", String(128)),
    Column("generation_batch_id", String(64)),
    Column("scoring_batch_id", String(64)),
    Column("report", JSON),  # the figures, the lines not compared, the thresholds used
    Column("passed", Boolean),
    Column("summary", Text),  # the verdict in words: "pass", or the figures that failed
    Column("error", JSON),  # why a run failed before it had figures
    Column("metadata", JSON),
    Column("created_at", UTCDateTime, nullable=False),
    Column("completed_at", UTCDateTime),
    Index("ix_quality_runs_tenant", "tenant_id", "created_at"),
    Index("ix_quality_runs_status", "status"),
)

quality_overrides = Table(
    "quality_overrides", Base.metadata,
    Column("id", String(64), primary_key=True),  # qovr_<hex>
    Column("tenant_id", String(64), nullable=False),
    Column("adapter", String(128)),  # None: the tenant's base-model traffic
    Column("to_base", String(200), nullable=False),
    Column("reason", Text, nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    Index("ix_quality_overrides_tenant", "tenant_id"),
)


def _v1(conn):
    Base.metadata.create_all(conn, tables=[quality_runs, quality_overrides], checkfirst=True)


MIGRATIONS = [Migration("quality", 1, "quality_runs and quality_overrides", _v1)]
