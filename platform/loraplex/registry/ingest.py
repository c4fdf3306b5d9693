"""Upload -> safe extraction -> validation -> content-addressed store, in one call.

This is what `POST /v1/adapters` runs. It blocks (disk, hashing), so async callers use
`await asyncio.to_thread(ingestor.ingest, tenant, name, upload.file)`.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from loraplex.registry.archive import ArchiveLimits, extract_archive, save_upload
from loraplex.registry.store import AdapterStore, check_name
from loraplex.registry.validator import AdapterValidator
from loraplex.registry.version import AdapterVersion


@dataclass
class AdapterIngestor:
    validator: AdapterValidator
    store: AdapterStore
    limits: ArchiveLimits = field(default_factory=ArchiveLimits)

    def ingest(self, tenant: str, name: str, upload: BinaryIO | Path) -> AdapterVersion:
        """Store an uploaded archive (stream or file path); raises AdapterError with its status."""
        check_name(tenant, "tenant id"), check_name(name)
        with tempfile.TemporaryDirectory(prefix="loraplex-upload-") as tmp:
            archive = Path(upload) if isinstance(upload, (str, Path)) else \
                save_upload(upload, Path(tmp) / "upload", self.limits)
            peft_dir = extract_archive(archive, Path(tmp) / "extracted", self.limits)
            adapter = self.validator.validate(peft_dir)
            return self.store.put(tenant, name, adapter)
