"""AdapterRegistry: what the adapter routes call. Upload = ingest into the store + catalog row."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from loraplex.registry.archive import ArchiveLimits
from loraplex.registry.catalog import AdapterCatalog, CatalogEntry
from loraplex.registry.errors import AdapterNotFound
from loraplex.registry.ingest import AdapterIngestor
from loraplex.registry.model_spec import BaseModelSpec
from loraplex.registry.store import AdapterStore
from loraplex.registry.validator import AdapterValidator


@dataclass
class AdapterRegistry:
    ingestor: AdapterIngestor
    catalog: AdapterCatalog

    def upload(self, tenant: str, name: str, upload: BinaryIO) -> CatalogEntry:
        return self.catalog.record(self.ingestor.ingest(tenant, name, upload))

    def resolve(self, tenant: str, ref: str) -> CatalogEntry:
        return self.catalog.resolve(tenant, ref)

    def list(self, tenant: str) -> list[CatalogEntry]:
        return self.catalog.list(tenant)

    def delete(self, tenant: str, ref: str) -> list[CatalogEntry]:
        # Catalog first: from this commit on, new requests 404. Engines free their copies
        # once the requests already running on them finish.
        entries = self.catalog.delete(tenant, ref)
        for entry in entries:
            try:
                self.ingestor.store.delete(tenant, entry.version.name, entry.version.sha256)
            except AdapterNotFound:
                pass  # the catalog is the authority; a missing blob is already gone
        return entries


def build_registry(config, db_engine) -> AdapterRegistry:
    """The registry for a PlatformConfig: validation against the served model, store, catalog."""
    engine_cfg, reg = config.engine, config.registry
    if (Path(engine_cfg.model) / "config.json").exists():
        spec = BaseModelSpec.from_pretrained_dir(engine_cfg.model, engine_cfg.model_id)
    else:  # an HF id: the same config.json, from the HF cache
        from transformers import AutoConfig

        spec = BaseModelSpec.from_config(AutoConfig.from_pretrained(engine_cfg.model).to_dict(), engine_cfg.model_id)
    limits = ArchiveLimits(
        max_upload_bytes=reg.max_upload_bytes, max_total_bytes=reg.max_unpacked_bytes, max_files=reg.max_files
    )
    store = AdapterStore(reg.store_url, reg.storage_options, reg.cache_dir)
    ingestor = AdapterIngestor(AdapterValidator(spec, max_lora_rank=engine_cfg.max_lora_rank), store, limits)
    return AdapterRegistry(ingestor, AdapterCatalog(db_engine))
