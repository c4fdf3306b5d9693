"""The Batch API's tables: files (bytes in the adapter store, files.py), batches, and one row per
line of a batch (its result once run: what the output and error files are written from)."""

from sqlalchemy import JSON, Column, Index, Integer, PrimaryKeyConstraint, String, Table, Text, inspect, text

from loraplex.db.base import Base
from loraplex.db.migrations import Migration
from loraplex.db.types import UTCDateTime

batch_files = Table(
    "batch_files", Base.metadata,
    Column("id", String(64), primary_key=True),  # file-<hex>
    Column("tenant_id", String(64), nullable=False),
    Column("purpose", String(32), nullable=False),  # batch (input), batch_output (output and error files)
    Column("filename", String(255), nullable=False),
    Column("bytes", Integer, nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    Column("deleted_at", UTCDateTime),  # deleted: 404 from then on; its bytes are gone from the store
    Index("ix_batch_files_tenant", "tenant_id", "created_at"),
)

batches = Table(
    "batches", Base.metadata,
    Column("id", String(64), primary_key=True),  # batch_<hex>
    Column("tenant_id", String(64), nullable=False),
    Column("api_key_id", String(64)),
    Column("endpoint", String(64), nullable=False),
    Column("input_file_id", String(64), nullable=False),
    Column("output_file_id", String(64)),
    Column("error_file_id", String(64)),
    Column("status", String(16), nullable=False),
    Column("metadata", JSON),
    Column("errors", JSON),  # why a batch failed: OpenAI's errors.data list
    Column("total", Integer, nullable=False, default=0),
    Column("completed", Integer, nullable=False, default=0),
    Column("failed", Integer, nullable=False, default=0),
    Column("created_at", UTCDateTime, nullable=False),
    Column("expires_at", UTCDateTime, nullable=False),
    *[Column(f"{s}_at", UTCDateTime) for s in ("in_progress", "finalizing", "completed", "failed", "expired",
                                               "cancelling", "cancelled")],
    # The runner that works on it (an Ingress replica) and until when; another takes it over after.
    Column("lease_owner", String(128)),
    Column("lease_until", UTCDateTime),
    # Parked (batch_tokens_per_day spent): no runner claims it before this, unless its window ended.
    Column("not_before", UTCDateTime),
    Index("ix_batches_tenant", "tenant_id", "created_at"),
    Index("ix_batches_status", "status"),
)

batch_lines = Table(
    "batch_lines", Base.metadata,
    Column("batch_id", String(64), nullable=False),
    Column("line_index", Integer, nullable=False),
    Column("custom_id", String(512), nullable=False),
    Column("state", String(8), nullable=False),  # pending, done (output file), error (error file)
    Column("request_id", String(128), nullable=False),  # the ledger's idempotency key: batch id + line
    Column("status_code", Integer),
    Column("result", Text),  # the response body (done) or the error (error), JSON
    Column("finished_at", UTCDateTime),
    PrimaryKeyConstraint("batch_id", "line_index"),
    Index("ix_batch_lines_state", "batch_id", "state"),
)


def _v1(conn):
    Base.metadata.create_all(conn, tables=[batch_files, batches, batch_lines], checkfirst=True)


def _v2_not_before(conn):
    # A database made by v1 lacks the column; one made now by _v1's create_all already has it.
    if "not_before" not in {c["name"] for c in inspect(conn).get_columns("batches")}:
        column = batches.c.not_before
        conn.execute(text(f"ALTER TABLE batches ADD COLUMN not_before {column.type.compile(conn.dialect)}"))


MIGRATIONS = [Migration("batches", 1, "batch_files, batches and batch_lines", _v1),
              Migration("batches", 2, "batches.not_before (parked by batch_tokens_per_day)", _v2_not_before)]
