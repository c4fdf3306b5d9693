"""AdapterRegistry: what the adapter routes call.

Upload = safe extraction -> validation -> the weights into the store (by sha256) -> a version in
the catalog. It blocks (disk, hashing, database), so async callers run it in a thread:
`await asyncio.to_thread(registry.upload, tenant, name, upload.file)`.
"""

from __future__ import annotations

import json
import logging
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, Callable, Optional

from loraplex.disk_full import upload_temp_full
from loraplex.quality.gate import Move
from loraplex.quality.repository import QualityRepository
from loraplex.registry.config import RegistryConfig
from loraplex.registry.archive import extract_archive, save_upload
from loraplex.registry.bases import ServedBase, ServedBases
from loraplex.registry.catalog import AdapterCatalog, AdapterVersion
from loraplex.registry.merged_checkpoint import delete_merged
from loraplex.registry.model_spec import BaseModelSpec
from loraplex.registry.quota import AdapterQuota
from loraplex.registry.store import AdapterStore, check_name
from loraplex.store_io import AdapterStoreUnavailable
from loraplex.registry.validator import CONFIG_FILE, AdapterValidator

if TYPE_CHECKING:  # annotations only: the root config imports this package's config, never the reverse
    from loraplex.config import PlatformConfig
    from loraplex.engine.config import EngineConfig

logger = logging.getLogger(__name__)


@dataclass
class AdapterRegistry:
    config: RegistryConfig  # the upload limits
    bases: ServedBases  # the base models and their validators; a version is bound to one
    store: AdapterStore
    catalog: AdapterCatalog
    # quality.gate: raises 409 unless a move to a base other than the adapter's own may go ahead
    gate: Optional[Callable[[Move], None]] = None

    def upload(self, tenant: str, name: str, upload: BinaryIO | Path, cancelled=None,
               quota: AdapterQuota | None = None, base_model: str | None = None) -> AdapterVersion:
        """Store an uploaded archive (stream or file path) as a version of `name`, bound to the base
        `base_model` names (else the one registry/bases.py chooses); raises a StatusError (400 bad
        archive, name or base, 413 too large, 422 not a servable LoRA of that base, 409 another base
        than the name's, 409/413 over the tenant's `quota`). `cancelled` (threading.Event): set, the
        copy stops at its next chunk (UploadCancelled). Every temporary file is in one
        TemporaryDirectory, gone on every way out."""
        check_name(tenant, "tenant id"), check_name(name)
        if base_model:
            self.bases.named(base_model)  # an unknown base costs no unpacking
        if quota is not None:
            self._check_quota_early(tenant, name, quota)
        try:
            return self._upload(tenant, name, upload, cancelled, quota, base_model)
        except OSError as exc:  # the temp dir full: its TemporaryDirectory is gone already, no row was added
            if (full := upload_temp_full(exc)) is not None:
                raise full from exc
            raise

    def _upload(self, tenant: str, name: str, upload: BinaryIO | Path, cancelled, quota: AdapterQuota | None,
                base_model: str | None) -> AdapterVersion:
        with tempfile.TemporaryDirectory(prefix="loraplex-upload-") as tmp:
            archive = Path(upload) if isinstance(upload, (str, Path)) else \
                save_upload(upload, Path(tmp) / "upload", self.config, cancelled)
            peft_dir = extract_archive(archive, Path(tmp) / "extracted", self.config, cancelled)
            claim = claimed_base(peft_dir)
            base = self.bases.choose(base_model, claim, self._base_of(tenant, name), name)
            trained = self.bases.named_by(claim)
            if self.gate is not None and trained is not None and trained.name != base.name:
                self.gate(Move(tenant, name, trained.name, base.name))  # before any work on the weights
            adapter = base.validator.validate(peft_dir)
            blob = self.store.put(tenant, adapter)

            def ensure_blob():
                # Under the tenant's lock, in the add's transaction: a delete of the same weights
                # under another name that removed the blob since our put ran wholly before this;
                # content-addressed, so putting it again is safe.
                if not self.store.exists(tenant, blob.sha256):
                    self.store.put(tenant, adapter)

            try:
                version = self.catalog.add(tenant, name, blob.sha256, rank=adapter.rank,
                                           target_modules=adapter.target_modules,
                                           # the served model it was validated against, by the name clients
                                           # call it: the adapter's own base_model_name_or_path is a free-text
                                           # hint (often a path on the trainer's disk)
                                           base_model=base.name,
                                           size_bytes=blob.size_bytes, quota=quota, ensure_blob=ensure_blob)
            except BaseException:
                # No version row (the database is down, or refused it): no blob of ours left
                # behind either, unless a live version uses it (another upload of the same
                # weights may have added its row since: checked under the tenant's lock).
                if blob.created:
                    try:
                        self.catalog.release_if_unused(tenant, blob.sha256, self._remove_blob(tenant))
                    except Exception:
                        # The database is unreachable (or failing): then no other upload can have
                        # committed a row on these weights either; remove them as they were put.
                        try:
                            self.store.delete(tenant, blob.sha256)
                        except AdapterStoreUnavailable:
                            # The store went too: complete weights no row names (never served;
                            # the same upload later reuses them). The caller gets the first error.
                            logger.warning("adapter store down: weights %s/%s stay unreferenced", tenant, blob.sha256)
                raise
        return version

    def _base_of(self, tenant: str, name: str) -> str | None:
        """The base `name`'s live versions are bound to (None: no live version)."""
        return next((v.base_model for v in self.catalog.list(tenant) if v.name == name), None)

    def _check_quota_early(self, tenant: str, name: str, quota: AdapterQuota) -> None:
        """Before unpacking: a tenant already at its quota spends no CPU on the archive. Weights the
        name has live again are no new version, so a name with a live version is left to the check
        at add (after hashing)."""
        if quota.max_versions is None and quota.max_bytes is None:
            return
        versions, stored = self.catalog.usage(tenant)
        full = (quota.max_versions is not None and versions >= quota.max_versions) or \
               (quota.max_bytes is not None and stored >= quota.max_bytes)
        if full and not any(v.name == name for v in self.catalog.list(tenant)):
            quota.check(versions, stored, new_bytes=1)

    def resolve(self, tenant: str, ref: str) -> AdapterVersion:
        return self.catalog.resolve(tenant, ref)

    def list(self, tenant: str) -> list[AdapterVersion]:
        return self.catalog.list(tenant)

    def delete(self, tenant: str, ref: str) -> list[AdapterVersion]:
        # Catalog first: from this commit on, new requests 404. Engines free their copies
        # once the requests already running on them finish.
        # Weights no live version uses any more (the same weights may live under another name) go
        # in the delete's own transaction, under the tenant's lock: see AdapterCatalog.delete.
        return self.catalog.delete(tenant, ref, on_unused=self._remove_blob(tenant))

    def _remove_blob(self, tenant: str):
        def remove(sha256: str) -> None:
            self.store.delete(tenant, sha256)
            delete_merged(self.store, tenant, sha256)  # a dedicated replica's, if it had one
        return remove


def build_registry(config: PlatformConfig, db_engine) -> AdapterRegistry:
    """The registry for a PlatformConfig: validation against each served base, store, catalog."""
    bases = ServedBases([ServedBase(base.model_id, base.engine.model, AdapterValidator(
        base_model_spec(base.engine), max_lora_rank=base.engine.max_lora_rank)) for base in config.bases()])
    # No gate without quality runs (they need the Batch API): nothing could clear it.
    runs_on = config.quality.enabled and config.batches.enabled
    gate = QualityRepository(db_engine).check_move if runs_on and config.quality.gate else None
    return AdapterRegistry(config.registry, bases, AdapterStore(config.registry), AdapterCatalog(db_engine), gate)


def base_model_spec(engine_cfg: EngineConfig) -> BaseModelSpec:
    """A base's module shapes, from its config.json (a local dir, else the HF cache)."""
    if (Path(engine_cfg.model) / "config.json").exists():
        return BaseModelSpec.from_pretrained_dir(engine_cfg.model, engine_cfg.model_id)
    from transformers import AutoConfig  # an HF id: the same config.json, from the HF cache

    return BaseModelSpec.from_config(AutoConfig.from_pretrained(engine_cfg.model).to_dict(), engine_cfg.model_id)


def claimed_base(peft_dir: Path) -> str | None:
    """The adapter's own `base_model_name_or_path` (a free-text hint), if it says one."""
    try:
        claim = json.loads((peft_dir / CONFIG_FILE).read_text()).get("base_model_name_or_path")
    except (OSError, ValueError, AttributeError):
        return None  # the validator says what is wrong with the config
    return claim if isinstance(claim, str) else None
