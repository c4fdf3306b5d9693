"""Adapter registry: safe archive extraction, LoRA validation, blobs by sha256, versions in the catalog.

archive.py (upload -> files), validator.py + model_spec.py (is it a LoRA the served model can
run), store.py (content-addressed blobs), catalog.py (versions: the database), registry.py (the
upload / resolve / list / delete the routes call).
"""

from loraplex.registry.archive import BadArchive, UploadTooLarge, extract_archive, save_upload
from loraplex.registry.catalog import AdapterCatalog, AdapterVersion, group_by_name, parse_ref
from loraplex.registry.model_spec import BaseModelSpec
from loraplex.registry.registry import AdapterRegistry, build_registry
from loraplex.registry.store import AdapterNotFound, AdapterStore, InvalidName, check_name
from loraplex.registry.validator import AdapterValidator, InvalidAdapter, ValidatedAdapter

__all__ = [
    "AdapterCatalog", "AdapterNotFound", "AdapterRegistry", "AdapterStore", "AdapterValidator", "AdapterVersion",
    "BadArchive", "BaseModelSpec", "InvalidAdapter", "InvalidName", "UploadTooLarge", "ValidatedAdapter",
    "build_registry", "check_name", "extract_archive", "group_by_name", "parse_ref", "save_upload",
]
