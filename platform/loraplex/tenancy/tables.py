from sqlalchemy import JSON, CheckConstraint, Column, ForeignKey, Index, String, Table

from loraplex.db import Base, Migration, UTCDateTime

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
