"""Adapter registry: safe archive extraction, LoRA validation, content-addressed storage."""

from loraplex.registry.archive import ArchiveLimits, extract_archive, save_upload
from loraplex.registry.errors import (AdapterError, AdapterNotFound, BadArchive, InvalidAdapter,
                                      InvalidName, UploadTooLarge)
from loraplex.registry.ingest import AdapterIngestor
from loraplex.registry.model_spec import BaseModelSpec
from loraplex.registry.store import AdapterStore, check_name
from loraplex.registry.validator import AdapterValidator, ValidatedAdapter
from loraplex.registry.version import AdapterVersion

__all__ = [
    "AdapterError", "AdapterIngestor", "AdapterNotFound", "AdapterStore", "AdapterValidator",
    "AdapterVersion", "ArchiveLimits", "BadArchive", "BaseModelSpec", "InvalidAdapter",
    "InvalidName", "UploadTooLarge", "ValidatedAdapter", "check_name", "extract_archive",
    "save_upload",
]
