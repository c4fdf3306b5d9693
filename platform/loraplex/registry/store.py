"""Content-addressed adapter storage on a local dir or any fsspec URL (s3://, gs://, ...).

Layout: <root>/<tenant>/<name>/<sha256>/{adapter_config.json, adapter_model.safetensors,
version.json}. version.json is written last, so a version exists only once all its files do
(object stores have no atomic directory rename). Deleting removes the weights and keeps
version.json as a tombstone, so a version number is never handed to other weights.

The store keeps no database: version numbers come from the version.json files. Two concurrent
uploads of *different* content to one name can pick the same number; the registry's database
(unique (tenant, name, version)) is the authority where one is used.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path

import fsspec

from loraplex.registry.canonical import CANONICAL_FILES, dir_sha256, write_canonical
from loraplex.registry.errors import AdapterNotFound, InvalidName
from loraplex.registry.validator import ValidatedAdapter
from loraplex.registry.version import AdapterVersion, utc_now

VERSION_FILE = "version.json"
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
SHA256 = re.compile(r"[0-9a-f]{64}")


def check_name(value: str, what: str = "adapter name") -> str:
    # Names become path segments and part of `name@version`: no '/', '@', or leading dot.
    if not isinstance(value, str) or not NAME.fullmatch(value):
        raise InvalidName(f"{what} {value!r} is not allowed; use 1-64 letters, digits, '.', '_' "
                          "or '-', starting with a letter or digit")
    return value


@dataclass
class AdapterStore:
    root: str = "adapters"  # local path or fsspec URL
    storage_options: dict = field(default_factory=dict)  # e.g. s3fs key/secret/client_kwargs
    cache_dir: str = ".cache/adapters"  # where engines keep fetched copies

    def __post_init__(self):
        self.fs, self.base = fsspec.core.url_to_fs(self.root, **self.storage_options)
        self.base = self.base.rstrip("/")

    # --- writes -------------------------------------------------------------------------

    def put(self, tenant: str, name: str, adapter: ValidatedAdapter) -> AdapterVersion:
        """Store a validated adapter; the same content under the same name returns its version."""
        check_name(tenant, "tenant id"), check_name(name)
        with tempfile.TemporaryDirectory(prefix="loraplex-put-") as tmp:
            sha = write_canonical(adapter, Path(tmp))
            existing = self._read_version(tenant, name, sha)
            if existing is not None and existing.deleted_at is None:
                return existing
            if existing is not None:  # re-upload after delete: same weights, same number
                version = replace(existing, created_at=utc_now(), deleted_at=None)
            else:
                version = AdapterVersion(
                    tenant=tenant, name=name, version=self._next_version(tenant, name), sha256=sha,
                    rank=adapter.rank, target_modules=adapter.target_modules,
                    base_model=adapter.base_model,
                    size_bytes=sum(os.path.getsize(os.path.join(tmp, f)) for f in CANONICAL_FILES),
                )
            target = self._dir(tenant, name, sha)
            self.fs.makedirs(target, exist_ok=True)
            for file in CANONICAL_FILES:
                self.fs.put_file(os.path.join(tmp, file), f"{target}/{file}")
            self.fs.pipe_file(f"{target}/{VERSION_FILE}", version.to_json())
        return version

    def delete(self, tenant: str, name: str, sha256: str | None = None) -> list[AdapterVersion]:
        """Delete one version (or all of `name`); returns what was deleted, 404 if nothing."""
        versions = [self.get(tenant, name, sha256)] if sha256 else self.list_versions(tenant, name)
        if not versions:
            raise self._not_found(tenant, name)
        deleted = []
        for v in versions:
            target = self._dir(tenant, name, v.sha256)
            tombstone = v.deleted()
            # Tombstone first: readers stop seeing the version before its files go.
            self.fs.pipe_file(f"{target}/{VERSION_FILE}", tombstone.to_json())
            for file in CANONICAL_FILES:
                if self.fs.exists(f"{target}/{file}"):
                    self.fs.rm_file(f"{target}/{file}")
            deleted.append(tombstone)
        return deleted

    # --- reads --------------------------------------------------------------------------

    def get(self, tenant: str, name: str, sha256: str) -> AdapterVersion:
        check_name(tenant, "tenant id"), check_name(name)
        v = self._read_version(tenant, name, sha256) if SHA256.fullmatch(sha256 or "") else None
        if v is None or v.deleted_at is not None:
            raise self._not_found(tenant, name, sha256)
        return v

    def resolve(self, tenant: str, name: str, version: str | int | None = None) -> AdapterVersion:
        """`name` -> latest version; `name@3` -> version 3; `name@<sha256>` -> that version."""
        versions = self.list_versions(tenant, name)
        if version is None or version == "":
            match = versions[-1:]
        elif str(version).isdigit():
            match = [v for v in versions if v.version == int(version)]
        else:
            match = [v for v in versions if v.sha256 == str(version)]
        if not match:
            raise self._not_found(tenant, name, version)
        return match[0]

    def list_versions(self, tenant: str, name: str) -> list[AdapterVersion]:
        """Live versions of one adapter, oldest first."""
        check_name(tenant, "tenant id"), check_name(name)
        return [v for v in self._all_versions(f"{tenant}/{name}/*") if v.deleted_at is None]

    def list_adapters(self, tenant: str) -> dict[str, list[AdapterVersion]]:
        """The tenant's live adapters: name -> versions, oldest first."""
        check_name(tenant, "tenant id")
        by_name: dict[str, list[AdapterVersion]] = {}
        for v in self._all_versions(f"{tenant}/*/*"):
            if v.deleted_at is None:
                by_name.setdefault(v.name, []).append(v)
        return dict(sorted(by_name.items()))

    # --- engine side --------------------------------------------------------------------

    def fetch_to_local_cache(self, tenant: str, name: str, sha256: str,
                             cache_dir: str | Path | None = None) -> Path:
        """Local dir holding the adapter (what vLLM's LoRARequest needs), downloaded once.

        The copy is checked against its sha256 before it becomes visible, then renamed into
        place, so concurrent fetches on one node never see a half-written adapter.
        """
        final = Path(cache_dir or self.cache_dir) / tenant / name / sha256
        if (final / CANONICAL_FILES[-1]).exists():
            return final
        self.get(tenant, name, sha256)  # 404 before downloading anything
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.parent / f".{sha256}.{uuid.uuid4().hex}"
        tmp.mkdir()
        try:
            source = self._dir(tenant, name, sha256)
            for file in CANONICAL_FILES:
                self.fs.get_file(f"{source}/{file}", str(tmp / file))
            got = dir_sha256(tmp)
            if got != sha256:
                raise RuntimeError(f"adapter {tenant}/{name}@{sha256} in {self.root} hashes to "
                                   f"{got}: the stored copy is corrupt; delete and re-upload it")
            try:
                tmp.rename(final)
            except OSError:
                if not final.exists():  # lost a race to another fetch: theirs is as good
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return final

    def evict_from_local_cache(self, tenant: str, name: str, sha256: str | None = None,
                               cache_dir: str | Path | None = None) -> None:
        path = Path(cache_dir or self.cache_dir) / tenant / name
        shutil.rmtree(path / sha256 if sha256 else path, ignore_errors=True)

    # --- helpers ------------------------------------------------------------------------

    def _dir(self, tenant: str, name: str, sha256: str) -> str:
        return f"{self.base}/{tenant}/{name}/{sha256}"

    def _read_version(self, tenant: str, name: str, sha256: str) -> AdapterVersion | None:
        path = f"{self._dir(tenant, name, sha256)}/{VERSION_FILE}"
        try:
            return AdapterVersion.from_json(self.fs.cat_file(path))
        except FileNotFoundError:
            return None

    def _all_versions(self, pattern: str) -> list[AdapterVersion]:
        # Object-store listings are cached per filesystem instance; another process may write.
        self.fs.invalidate_cache()
        paths = self.fs.glob(f"{self.base}/{pattern}/{VERSION_FILE}")
        versions = [AdapterVersion.from_json(self.fs.cat_file(p)) for p in paths]
        return sorted(versions, key=lambda v: (v.name, v.version))

    def _next_version(self, tenant: str, name: str) -> int:
        return 1 + max((v.version for v in self._all_versions(f"{tenant}/{name}/*")), default=0)

    @staticmethod
    def _not_found(tenant: str, name: str, version=None) -> AdapterNotFound:
        ref = f"{name}@{version}" if version not in (None, "") else name
        return AdapterNotFound(f"adapter {ref!r} not found for this tenant; list yours with "
                               "GET /v1/adapters")
