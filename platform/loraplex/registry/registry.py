"""AdapterRegistry: what the adapter routes call.

Upload = safe extraction -> validation -> the weights into the store (by sha256) -> a version in
the catalog. It blocks (disk, hashing, database), so async callers run it in a thread:
`await asyncio.to_thread(registry.upload, tenant, name, upload.file)`.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from loraplex.config import PlatformConfig, RegistryConfig
from loraplex.registry.archive import extract_archive, save_upload
from loraplex.registry.catalog import AdapterCatalog, AdapterVersion
from loraplex.registry.merged_checkpoint import delete_merged
from loraplex.registry.model_spec import BaseModelSpec
from loraplex.registry.store import AdapterStore, check_name
from loraplex.registry.validator import AdapterValidator


@dataclass
class AdapterRegistry:
    config: RegistryConfig  # the upload limits
    validator: AdapterValidator
    store: AdapterStore
    catalog: AdapterCatalog

    def upload(self, tenant: str, name: str, upload: BinaryIO | Path, cancelled=None) -> AdapterVersion:
        """Store an uploaded archive (stream or file path) as a version of `name`; raises a
        StatusError (400 bad archive or name, 413 too large, 422 not a servable LoRA).
        `cancelled` (threading.Event): set, the copy stops at its next chunk (UploadCancelled).
        Every temporary file is in one TemporaryDirectory, gone on every way out of here."""
        check_name(tenant, "tenant id"), check_name(name)
        with tempfile.TemporaryDirectory(prefix="loraplex-upload-") as tmp:
            archive = Path(upload) if isinstance(upload, (str, Path)) else \
                save_upload(upload, Path(tmp) / "upload", self.config, cancelled)
            adapter = self.validator.validate(extract_archive(archive, Path(tmp) / "extracted", self.config,
                                                              cancelled))
            blob = self.store.put(tenant, adapter)
            try:
                version = self.catalog.add(tenant, name, blob.sha256, rank=adapter.rank,
                                           target_modules=adapter.target_modules,
                                           # the served model it was validated against, by the name clients
                                           # call it: the adapter's own base_model_name_or_path is a free-text
                                           # hint (often a path on the trainer's disk)
                                           base_model=self.validator.base.model_id,
                                           size_bytes=blob.size_bytes)
            except BaseException:
                # No version row (the database is down, or refused it): no blob of ours left
                # behind either. One that was there before belongs to other versions.
                if blob.created:
                    self.store.delete(tenant, blob.sha256)
                raise
            # A concurrent delete of the same weights under another name may have removed the blob
            # between put and add; it is content-addressed, so putting it again is safe.
            if not self.store.exists(tenant, blob.sha256):
                self.store.put(tenant, adapter)
        return version

    def resolve(self, tenant: str, ref: str) -> AdapterVersion:
        return self.catalog.resolve(tenant, ref)

    def list(self, tenant: str) -> list[AdapterVersion]:
        return self.catalog.list(tenant)

    def delete(self, tenant: str, ref: str) -> list[AdapterVersion]:
        # Catalog first: from this commit on, new requests 404. Engines free their copies
        # once the requests already running on them finish.
        versions = self.catalog.delete(tenant, ref)
        for sha256 in {v.sha256 for v in versions}:
            if not self.catalog.sha_in_use(tenant, sha256):  # the same weights under another name
                self.store.delete(tenant, sha256)
                delete_merged(self.store, tenant, sha256)  # a dedicated replica's, if it had one
        return versions


def build_registry(config: PlatformConfig, db_engine) -> AdapterRegistry:
    """The registry for a PlatformConfig: validation against the served model, store, catalog."""
    engine_cfg = config.engine
    if (Path(engine_cfg.model) / "config.json").exists():
        spec = BaseModelSpec.from_pretrained_dir(engine_cfg.model, engine_cfg.model_id)
    else:  # an HF id: the same config.json, from the HF cache
        from transformers import AutoConfig

        spec = BaseModelSpec.from_config(AutoConfig.from_pretrained(engine_cfg.model).to_dict(), engine_cfg.model_id)
    return AdapterRegistry(config.registry, AdapterValidator(spec, max_lora_rank=engine_cfg.max_lora_rank),
                           AdapterStore(config.registry), AdapterCatalog(db_engine))
