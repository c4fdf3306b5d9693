"""File bytes of the Batch API in the adapter store (registry.store_url: a local dir or any fsspec
URL), beside the tenant's adapters and isolated the same way: <root>/<tenant>/batch-files/<file id>.
A tenant id and a file id are both checked plain names, so no path ever leaves its tenant's dir.
Every call is bounded by registry.store_timeout_s like the adapters' (loraplex/store_io.py): a store
that is down answers 503 AdapterStoreUnavailable; the batch runner leaves the batch for later."""

from __future__ import annotations

import re

import fsspec

from loraplex.store_io import DELETE, READ, WRITE, BoundedStore


FILE_ID = re.compile(r"file-[0-9a-f]{32}")
TENANT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")  # registry.store.NAME (not imported: it imports the config)
DIR = "batch-files"  # never an adapter blob's dir (a sha256)


class BatchFileStore:
    def __init__(self, store_url: str, storage_options: dict | None = None, timeout_s: float = 20.0):
        # registry.store_url / storage_options / store_timeout_s (no import of the config: it imports this package's)
        self.fs, base = fsspec.core.url_to_fs(store_url, **(storage_options or {}))
        self.base = base.rstrip("/")
        self.io = BoundedStore(store_url, timeout_s)

    def put(self, tenant: str, file_id: str, data: bytes) -> None:
        path = self._path(tenant, file_id)
        what = "the file was not stored"
        self.io.call(WRITE, what, self.fs.makedirs, path.rsplit("/", 1)[0], exist_ok=True)
        self.io.call(WRITE, what, self.fs.pipe_file, path, data)

    def get(self, tenant: str, file_id: str) -> bytes:
        self.fs.invalidate_cache()
        return self.io.call(READ, "the file could not be read", self.fs.cat_file, self._path(tenant, file_id))

    def delete(self, tenant: str, file_id: str) -> None:
        path = self._path(tenant, file_id)
        what = "the file was not deleted"
        self.fs.invalidate_cache()
        if self.io.call(READ, what, self.fs.exists, path):
            self.io.call(DELETE, what, self.fs.rm_file, path)

    def _path(self, tenant: str, file_id: str) -> str:
        if not TENANT.fullmatch(tenant or ""):
            raise ValueError(f"{tenant!r} is not a tenant id")
        if not FILE_ID.fullmatch(file_id or ""):
            raise ValueError(f"{file_id!r} is not a file id")
        return f"{self.base}/{tenant}/{DIR}/{file_id}"
