"""Content-addressed adapter blobs on a local dir or any fsspec URL (s3://, gs://, ...).

A blob is the canonical form of a validated adapter, addressed by its sha256. We hash the
canonical files, not the uploaded archive: re-packing the same adapter (another tar tool, gzip
timestamp, file order, zip instead of tar, a top-level folder or not) must give the same sha, so
uploads are idempotent and a vLLM LoRA name `tenant/name@version:sha` always means the same weights.
Canonical = adapter_config.json re-serialized with sorted keys, plus the safetensors bytes as
uploaded; README and other extras are dropped.

Layout: <root>/<tenant>/<sha256>/{adapter_config.json, adapter_model.safetensors, COMPLETE}.
The tenant is in the path so tenants never share (or delete) each other's blobs. COMPLETE is
written last and removed first, so a blob exists only while all its files do (object stores
have no atomic directory rename). The store knows no names and no versions: the catalog
(catalog.py) maps `name`, `name@N` and `name@<sha256>` to a sha256.

Every call to the store is bounded by registry.store_timeout_s (store_io.py): a store that is down
or frozen answers the request that needed it 503 AdapterStoreUnavailable, never a hang.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import NamedTuple

import fsspec

from loraplex.disk_full import CACHE_DISK, CacheDiskFull, count_disk_full, is_disk_full
from loraplex.registry.config import RegistryConfig
from loraplex.errors import StatusError
from loraplex.store_io import DELETE, READ, WRITE, BoundedStore
from loraplex.registry.validator import CONFIG_FILE, WEIGHTS_FILE, ValidatedAdapter

CANONICAL_FILES = (CONFIG_FILE, WEIGHTS_FILE)  # sorted: the hash order
COMPLETE_FILE = "COMPLETE"
CHUNK = 1 << 20
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
SHA256 = re.compile(r"[0-9a-f]{64}")


class InvalidName(StatusError):
    status = 400


class AdapterNotFound(StatusError):
    status = 404


def check_name(value: str, what: str = "adapter name") -> str:
    # Tenant ids are path segments, adapter names part of `name@version`: no '/', '@', or leading dot.
    if not isinstance(value, str) or not NAME.fullmatch(value):
        raise InvalidName(f"{what} {value!r} is not allowed; use 1-64 letters, digits, '.', '_' "
                          "or '-', starting with a letter or digit")
    return value


class Blob(NamedTuple):
    sha256: str
    size_bytes: int  # of the canonical files
    created: bool = False  # put() wrote it (it was not in the store before)


def canonical_config_bytes(config: dict) -> bytes:
    return (json.dumps(config, sort_keys=True, indent=2, ensure_ascii=False) + "\n").encode()


def write_canonical(adapter: ValidatedAdapter, out_dir: Path) -> Blob:
    """Write the canonical files of `adapter` into `out_dir`; return their sha256 and size."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / CONFIG_FILE).write_bytes(canonical_config_bytes(adapter.config))
    shutil.copyfile(adapter.path / WEIGHTS_FILE, out_dir / WEIGHTS_FILE)
    return Blob(dir_sha256(out_dir), sum((out_dir / f).stat().st_size for f in CANONICAL_FILES))


def dir_sha256(path: Path) -> str:
    """sha256 over (name, size, bytes) of each canonical file in a fixed order."""
    h = hashlib.sha256()
    for name in CANONICAL_FILES:
        file = path / name
        h.update(f"{name}\n{file.stat().st_size}\n".encode())
        with open(file, "rb") as f:
            while chunk := f.read(CHUNK):
                h.update(chunk)
    return h.hexdigest()


class AdapterStore:
    """Blobs by (tenant, sha256) in `store_url`; engines copy them into the node-local `cache_dir`."""

    def __init__(self, config: RegistryConfig):
        self.root = config.store_url
        self.storage_options = config.storage_options
        self.cache_dir = Path(config.cache_dir)
        self.cache_max_bytes = config.cache_max_bytes  # engines prune cache_dir to it (LoadedAdapters)
        self.fs, base = fsspec.core.url_to_fs(self.root, **self.storage_options)
        self.base = base.rstrip("/")
        self.io = BoundedStore(self.root, config.store_timeout_s)

    def put(self, tenant: str, adapter: ValidatedAdapter) -> Blob:
        """Store a validated adapter's canonical form; storing the same content again is a no-op."""
        check_name(tenant, "tenant id")
        with tempfile.TemporaryDirectory(prefix="loraplex-put-") as tmp:
            blob = write_canonical(adapter, Path(tmp))
            if not self.exists(tenant, blob.sha256, what="the upload was not stored"):
                target = self._dir(tenant, blob.sha256)
                what = "the upload was not stored (nothing of it is visible)"
                self.io.call(WRITE, what, self.fs.makedirs, target, exist_ok=True)
                for file in CANONICAL_FILES:
                    self.io.call(WRITE, what, self.fs.put_file, str(Path(tmp) / file), f"{target}/{file}")
                self.io.call(WRITE, what, self.fs.pipe_file, f"{target}/{COMPLETE_FILE}", blob.sha256.encode())
                blob = blob._replace(created=True)
        return blob

    def exists(self, tenant: str, sha256: str, what: str = "the adapter's weights could not be checked") -> bool:
        check_name(tenant, "tenant id")
        if not SHA256.fullmatch(sha256 or ""):
            return False
        # Object-store metadata is cached per filesystem instance; another process may write.
        self.fs.invalidate_cache()
        return self.io.call(READ, what, self.fs.exists, f"{self._dir(tenant, sha256)}/{COMPLETE_FILE}")

    def delete(self, tenant: str, sha256: str) -> None:
        """Remove a blob (idempotent). The caller checks that no live version still uses it."""
        what = "the adapter's weights were not deleted"
        if not self.exists(tenant, sha256, what):
            return
        target = self._dir(tenant, sha256)
        # Marker first: readers stop seeing the blob before its files go.
        for file in (COMPLETE_FILE, *CANONICAL_FILES):
            if self.io.call(READ, what, self.fs.exists, f"{target}/{file}"):
                self.io.call(DELETE, what, self.fs.rm_file, f"{target}/{file}")

    # --- engine side --------------------------------------------------------------------

    def fetch_to_local_cache(self, tenant: str, sha256: str, cache_dir: str | Path | None = None) -> Path:
        """Local dir holding the blob (what vLLM's LoRARequest needs), downloaded once per node.

        The copy is checked against its sha256 before it becomes visible, then renamed into
        place, so concurrent fetches on one node never see a half-written adapter.
        """
        final = self._local_dir(tenant, sha256, cache_dir)
        if (final / CANONICAL_FILES[-1]).exists():
            return final
        what = "this adapter version, not yet on this replica, could not be loaded"
        if not self.exists(tenant, sha256, what):  # 404 before downloading anything
            raise AdapterNotFound(f"adapter weights {sha256} not found for this tenant (deleted?); "
                                  "list yours with GET /v1/adapters")
        tmp = final.parent / f".{sha256}.{uuid.uuid4().hex}"
        try:
            final.parent.mkdir(parents=True, exist_ok=True)
            tmp.mkdir()
            source = self._dir(tenant, sha256)
            for file in CANONICAL_FILES:
                self.io.call(READ, what, self.fs.get_file, f"{source}/{file}", str(tmp / file))
            got = dir_sha256(tmp)
            if got != sha256:
                raise RuntimeError(f"adapter blob {tenant}/{sha256} in {self.root} hashes to "
                                   f"{got}: the stored copy is corrupt; delete and re-upload it")
            try:
                tmp.rename(final)
            except OSError:
                if not final.exists():  # lost a race to another fetch: theirs is as good
                    raise
        except OSError as e:
            if not is_disk_full(e):
                raise
            count_disk_full(CACHE_DISK, e)
            raise CacheDiskFull(final.parent.parent, e) from e
        finally:
            shutil.rmtree(tmp, ignore_errors=True)  # a partial copy leaves nothing behind
        return final

    def blob_bytes(self, tenant: str, sha256: str) -> int:
        """Bytes of a blob's canonical files in the store (what a copy of it needs in the cache)."""
        source, what = self._dir(tenant, sha256), "the adapter's size could not be read"
        return sum(self.io.call(READ, what, self.fs.size, f"{source}/{file}") for file in CANONICAL_FILES)

    def evict_from_local_cache(self, tenant: str, sha256: str, cache_dir: str | Path | None = None) -> None:
        shutil.rmtree(self._local_dir(tenant, sha256, cache_dir), ignore_errors=True)

    # --- helpers ------------------------------------------------------------------------

    def _dir(self, tenant: str, sha256: str) -> str:
        return f"{self.base}/{tenant}/{sha256}"

    def _local_dir(self, tenant: str, sha256: str, cache_dir: str | Path | None) -> Path:
        check_name(tenant, "tenant id")
        if not SHA256.fullmatch(sha256 or ""):
            raise AdapterNotFound(f"{sha256!r} is not an adapter sha256")
        return Path(cache_dir or self.cache_dir) / tenant / sha256
