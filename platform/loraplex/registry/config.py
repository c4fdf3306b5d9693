"""RegistryConfig: where tenants' adapters are stored and what an upload may be."""

from __future__ import annotations

from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, Field


class RegistryConfig(BaseModel):
    """Where tenants' adapters live and what an upload may be."""

    model_config = ConfigDict(extra="forbid")

    store_url: str = Field(
        "adapters",
        description="Adapter store: a local dir (single node) or any fsspec URL such as "
        "s3://bucket/prefix or gs://bucket/prefix (multi-node clusters).",
    )
    storage_options: dict[str, Any] = Field(
        default_factory=dict, repr=False,
        description="fsspec options for store_url (endpoint, credentials), kept out of repr().",
    )
    store_shared: bool = Field(
        False,
        description="store_url is a local path that every node mounts (NFS, EFS): allow it on a "
        "multi-node cluster, where a node-local store is otherwise refused at start.",
    )
    cache_dir: str = Field(
        "var/adapter-cache",
        description="Node-local dir where engine replicas keep fetched adapters; may name "
        "environment variables ($VAR, ~), expanded on each node.",
    )
    cache_max_bytes: Optional[int] = Field(
        8 << 30, gt=0,
        description="Bytes of fetched adapters an Engine replica keeps in cache_dir, least recently used versions "
        "not in use removed first; null: keep every fetched version until it is deleted.",
    )
    store_timeout_s: float = Field(
        20.0, gt=0,
        description="Seconds one call to the store may take before the request that needed it gets 503 + "
        "Retry-After naming the store.",
    )
    max_upload_bytes: int = Field(512 << 20, gt=0, description="Bigger uploads get 413.")
    max_unpacked_bytes: int = Field(1 << 30, gt=0, description="Bigger unpacked archives get 413.")
    max_files: int = Field(32, gt=0, description="Archives with more files are refused.")
    max_compression_ratio: float = Field(
        100.0, gt=1,
        description="An archive unpacking to more than this many times its own size (past ratio_free_bytes) is "
        "refused with 413 as it streams.",
    )
    ratio_free_bytes: int = Field(
        16 << 20, ge=0,
        description="Unpacked bytes an archive may reach whatever its compression ratio.",
    )
    upload_workers: int = Field(
        2, ge=1,
        description="Threads per ingress replica that unpack, validate and store uploads (and run deletes), apart "
        "from the threads adapter resolution and key checks run on.",
    )
    uploads_per_tenant: int = Field(
        1, ge=1,
        description="Uploads (and deletes) of one tenant in progress at once per ingress replica; one more gets "
        "429 + Retry-After before its body is read.",
    )
    deletion_poll_s: float = Field(
        2.0, gt=0, description="How often engine replicas look for deleted adapters to free."
    )
    cache_salt_per_tenant: bool = Field(
        True, description="Salt each tenant's prefix-cache keys: KV blocks are never shared across tenants."
    )
