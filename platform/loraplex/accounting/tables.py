from sqlalchemy import (BigInteger, Boolean, Column, Float, Index, Integer, PrimaryKeyConstraint, String, Table, false,
                        inspect, text)

from loraplex.db.base import Base
from loraplex.db.migrations import Migration
from loraplex.db.types import UTCDateTime

usage_records = Table(
    "usage_records", Base.metadata,
    Column("request_id", String(128), primary_key=True),  # the idempotency key
    Column("tenant_id", String(64), nullable=False),
    Column("api_key_id", String(64)),
    Column("base_model", String(200), nullable=False),
    Column("adapter", String(200)),
    Column("prompt_tokens", Integer, nullable=False),
    Column("cached_prompt_tokens", Integer, nullable=False),
    Column("completion_tokens", Integer, nullable=False),
    Column("status", String(32), nullable=False),
    Column("arrival_time", UTCDateTime, nullable=False),
    Column("first_token_time", UTCDateTime),
    # Reports and billing attribute a request to the period its finish_time falls in.
    Column("finish_time", UTCDateTime, nullable=False),
    Column("ttft", Float),
    Column("replica_id", String(128)),
    Column("path", String(16)),  # "lora" / "merged" (an adapter's request), NULL: the base model
    Column("batch", Boolean, nullable=False, server_default=false()),  # a Batch API line (issue 36)
    # Prompt tokens prefilled again on the replicas a request moved to (issue 48): not billed.
    Column("migrated_prompt_tokens", Integer, nullable=False, server_default=text("0")),
    Index("ix_usage_records_tenant_finish", "tenant_id", "finish_time"),
    Index("ix_usage_records_finish", "finish_time"),
)

# Pre-engine refusals, aggregated per flush batch; batch_id makes a replayed batch a no-op.
usage_rejections = Table(
    "usage_rejections", Base.metadata,
    Column("batch_id", String(36), nullable=False),
    Column("tenant_id", String(64), nullable=False),
    Column("reason", String(64), nullable=False),
    Column("hour", UTCDateTime, nullable=False),
    Column("count", BigInteger, nullable=False),
    PrimaryKeyConstraint("batch_id", "tenant_id", "reason", "hour"),
    Index("ix_usage_rejections_tenant_hour", "tenant_id", "hour"),
)


def _v1(conn):
    # Creates the tables as declared above; later versions must use explicit ALTERs.
    Base.metadata.create_all(conn, tables=[usage_records, usage_rejections], checkfirst=True)


def _v2_path(conn):
    # A database made by v1 lacks the column; one made now by _v1's create_all already has it.
    columns = {c["name"] for c in inspect(conn).get_columns("usage_records")}
    if "path" not in columns:
        conn.execute(text("ALTER TABLE usage_records ADD COLUMN path VARCHAR(16)"))


def _batch_column(conn):
    columns = {c["name"] for c in inspect(conn).get_columns("usage_records")}
    if "batch" not in columns:
        conn.execute(text("ALTER TABLE usage_records ADD COLUMN batch BOOLEAN NOT NULL DEFAULT FALSE"))


def _migrated_prompt_tokens_column(conn):
    columns = {c["name"] for c in inspect(conn).get_columns("usage_records")}
    if "migrated_prompt_tokens" not in columns:
        conn.execute(text("ALTER TABLE usage_records ADD COLUMN migrated_prompt_tokens INTEGER NOT NULL DEFAULT 0"))


# The batch column is its own component's (not accounting 3): another branch's accounting
# migrations are numbered without coordinating with this one.
MIGRATIONS = [Migration("accounting", 1, "usage_records and usage_rejections", _v1),
              Migration("accounting", 2, "usage_records.path (lora / merged)", _v2_path),
              Migration("accounting_batch", 1, "usage_records.batch (Batch API lines)", _batch_column),
              Migration("accounting_migration", 1, "usage_records.migrated_prompt_tokens (moved requests)",
                        _migrated_prompt_tokens_column)]
