"""Safe extraction of uploaded adapter archives (.tar.gz / .tgz / .zip).

An upload is untrusted input headed for the filesystem, so extraction refuses anything that
is not a plain file or directory with a relative, `..`-free path, and bounds both the declared
and the actually decompressed size (a 1 MB gzip can expand to gigabytes). We copy file bytes
ourselves instead of calling extractall(): that is where the actual-byte count is enforced.
Beyond `ratio_free_bytes`, the unpacked bytes may not pass `max_compression_ratio` times the
archive's size (RegistryConfig): checked on zip headers before anything is written, and on the
stream as it is written, for every compression alike (deflate, bz2, lzma, gzip); a bomb is
stopped after ratio_free_bytes, not after max_unpacked_bytes. `cancelled` (a threading.Event)
stops a copy at its next chunk: the async caller is gone (client disconnect).
"""

from __future__ import annotations

import gzip
import stat
import tarfile
import zipfile
import zlib
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from loraplex.registry.config import RegistryConfig
from loraplex.errors import StatusError

CHUNK = 1 << 20
CONFIG_NAME = "adapter_config.json"
# Junk that archivers on macOS add; ignored when looking for the single top-level folder.
IGNORED_TOP_LEVEL = {"__MACOSX", ".DS_Store"}


class BadArchive(StatusError):
    """Not a readable .tar.gz/.tgz/.zip, or an entry we refuse to extract (400)."""

    status = 400


class UploadTooLarge(StatusError):
    """The upload, or what it would decompress to, is over a size bound (413)."""

    status = 413


class UploadCancelled(Exception):
    """The caller stopped waiting for this upload (its client went away): stop, leave nothing."""


def _check_cancelled(cancelled) -> None:
    if cancelled is not None and cancelled.is_set():
        raise UploadCancelled("the upload's request was cancelled")


def save_upload(stream: BinaryIO, dest: Path, limits: RegistryConfig | None = None, cancelled=None) -> Path:
    """Copy an upload stream to `dest`, refusing it (413) as soon as it passes max_upload_bytes.

    `limits`: max_upload_bytes, max_unpacked_bytes and max_files (defaults: RegistryConfig's)."""
    limits = limits or RegistryConfig()
    written = 0
    with open(dest, "wb") as out:
        while chunk := stream.read(CHUNK):
            _check_cancelled(cancelled)
            written += len(chunk)
            if written > limits.max_upload_bytes:
                raise _upload_too_large(limits)
            out.write(chunk)
    return dest


def extract_archive(archive: Path, dest: Path, limits: RegistryConfig | None = None, cancelled=None) -> Path:
    """Extract `archive` into the empty dir `dest`; return the PEFT dir inside it.

    The PEFT dir is `dest` itself or its one top-level folder. Raises BadArchive (400) or
    UploadTooLarge (413). The format comes from the file's magic bytes, not its name.
    """
    limits = limits or RegistryConfig()
    if archive.stat().st_size > limits.max_upload_bytes:
        raise _upload_too_large(limits)
    dest.mkdir(parents=True, exist_ok=True)
    with open(archive, "rb") as f:
        magic = f.read(4)
    budget = _Budget(limits, archive.stat().st_size, cancelled)
    if magic.startswith(b"PK\x03\x04") or magic.startswith(b"PK\x05\x06"):
        _extract_zip(archive, dest, budget)
    elif magic.startswith(b"\x1f\x8b"):
        _extract_tar(archive, dest, budget)
    else:
        raise BadArchive("the upload is not a .tar.gz, .tgz or .zip archive; pack the PEFT dir "
                         "with `tar czf adapter.tar.gz -C <dir> .` or `zip -r adapter.zip <dir>`")
    return find_peft_dir(dest)


def find_peft_dir(root: Path) -> Path:
    if (root / CONFIG_NAME).exists():
        return root
    entries = [p for p in root.iterdir() if p.name not in IGNORED_TOP_LEVEL]
    if len(entries) == 1 and entries[0].is_dir():
        return entries[0]
    # No config at the root nor in a single folder: the validator reports the missing config.
    return root


class _Budget:
    """Counts files and bytes across the whole archive, against the size and ratio bounds."""

    def __init__(self, limits: RegistryConfig, archive_bytes: int, cancelled=None):
        self.limits, self.files, self.declared, self.actual = limits, 0, 0, 0
        self.cancelled = cancelled
        # What the archive may unpack to: its size times the ratio cap, past the free allowance.
        self.ratio_bound = max(limits.ratio_free_bytes, limits.max_compression_ratio * max(archive_bytes, 1))

    def check_ratio(self, unpacked: int, packed: int | None = None) -> None:
        """`unpacked` bytes so far (of one zip member: `packed` its compressed size) over the ratio cap?"""
        if packed is not None:
            if unpacked > max(self.limits.ratio_free_bytes, self.limits.max_compression_ratio * max(packed, 1)):
                raise _expands_too_much(self.limits)
        elif unpacked > self.ratio_bound:
            raise _expands_too_much(self.limits)

    def add_entry(self, declared_size: int) -> None:
        self.files += 1
        if self.files > self.limits.max_files:
            raise BadArchive(f"the archive has more than {self.limits.max_files} entries; a LoRA "
                             "adapter needs only adapter_config.json and adapter_model.safetensors")
        self.declared += max(declared_size, 0)
        if self.declared > self.limits.max_unpacked_bytes:
            raise _expands_too_large(self.limits)

    def add_bytes(self, n: int) -> None:
        _check_cancelled(self.cancelled)
        self.actual += n
        if self.actual > self.limits.max_unpacked_bytes:
            raise _expands_too_large(self.limits)
        self.check_ratio(self.actual)


def _safe_relpath(name: str, seen: set[str]) -> PurePosixPath | None:
    """The entry's path inside dest, or None for the archive root itself ('./')."""
    if "\\" in name or "\x00" in name:
        raise BadArchive(f"archive entry {name!r} has a backslash or NUL in its path; "
                         "re-pack it with forward-slash relative paths")
    path = PurePosixPath(name)
    if path.is_absolute() or (path.parts and ":" in path.parts[0]):
        raise BadArchive(f"archive entry {name!r} has an absolute path; pack the adapter with "
                         "paths relative to its folder (tar -C <dir> .)")
    if ".." in path.parts:
        raise BadArchive(f"archive entry {name!r} points outside the archive ('..'); "
                         "pack the adapter with plain relative paths")
    parts = [p for p in path.parts if p != "."]
    if not parts:
        return None
    rel = PurePosixPath(*parts)
    if str(rel) in seen:
        raise BadArchive(f"archive entry {name!r} appears twice; pack each file once")
    seen.add(str(rel))
    return rel


def _copy(src: BinaryIO, target: Path, budget: _Budget) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target, "wb") as out:
        while chunk := src.read(CHUNK):
            budget.add_bytes(len(chunk))
            out.write(chunk)


def _extract_tar(archive: Path, dest: Path, budget: _Budget) -> None:
    seen: set[str] = set()
    try:
        # Iterating (not getmembers()) reads headers lazily: we stop at the first bad one
        # instead of decompressing a whole bomb to build a member list.
        with _BoundedGzip(archive, budget) as gz, tarfile.open(fileobj=gz, mode="r:") as tar:
            for member in tar:
                budget.add_entry(member.size)
                rel = _safe_relpath(member.name, seen)
                if member.isdir():
                    if rel is not None:
                        (dest / rel).mkdir(parents=True, exist_ok=True)
                elif member.isfile() and rel is not None:
                    _copy(tar.extractfile(member), dest / rel, budget)
                else:
                    kind = _tar_kind(member)
                    raise BadArchive(f"archive entry {member.name!r} is a {kind}; only regular "
                                     "files and folders are accepted — replace it with the file itself")
    except (FileExistsError, NotADirectoryError, IsADirectoryError) as e:
        raise BadArchive(f"archive entries conflict ({e}): a path is both a file and a folder; "
                         "re-pack the adapter dir") from e
    except (tarfile.TarError, EOFError, gzip.BadGzipFile, zlib.error) as e:
        raise BadArchive(f"the .tar.gz is corrupt or truncated ({e}); re-create it with "
                         "`tar czf adapter.tar.gz -C <dir> .`") from e


class _BoundedGzip(gzip.GzipFile):
    """Decompressed tar stream that stops past the size bound.

    Header blocks and pax records are read by tarfile itself, outside our per-file count; a
    single pax header declaring gigabytes would otherwise be read into memory.
    """

    HEADER_SLACK = 1 << 20

    def __init__(self, path: Path, budget: _Budget):
        super().__init__(path, "rb")
        self.budget = budget

    def read(self, size=-1):
        data = super().read(size)
        unpacked = self.tell()
        if unpacked > self.budget.limits.max_unpacked_bytes + self.HEADER_SLACK:
            raise _expands_too_large(self.budget.limits)
        # Headers and padding included: a tar of one huge pax header is a bomb too.
        self.budget.check_ratio(unpacked)
        return data


def _tar_kind(member: tarfile.TarInfo) -> str:
    if member.issym():
        return "symlink"
    if member.islnk():
        return "hard link"
    if member.ischr() or member.isblk():
        return "device file"
    if member.isfifo():
        return "fifo"
    return "special entry"


def _extract_zip(archive: Path, dest: Path, budget: _Budget) -> None:
    seen: set[str] = set()
    try:
        with zipfile.ZipFile(archive) as zf:
            infos, paths = zf.infolist(), []
            for info in infos:
                # Check every header before writing anything: cheap, and the bomb never starts.
                budget.add_entry(info.file_size)
                # Whatever the method (stored, deflate, bz2, lzma): zipfile decompresses each to
                # its declared size at most, so the declared ratio bounds what it writes.
                budget.check_ratio(info.file_size, info.compress_size)
                paths.append(_safe_relpath(info.filename, seen))
                mode = info.external_attr >> 16
                if stat.S_IFMT(mode) and not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                    kind = "symlink" if stat.S_ISLNK(mode) else "special file"
                    raise BadArchive(f"archive entry {info.filename!r} is a {kind}; only regular "
                                     "files and folders are accepted — replace it with the file itself")
                if info.flag_bits & 0x1:
                    raise BadArchive(f"archive entry {info.filename!r} is encrypted; "
                                     "upload an unencrypted zip")
            for info, rel in zip(infos, paths):
                if rel is None:
                    continue
                if info.is_dir():
                    (dest / rel).mkdir(parents=True, exist_ok=True)
                else:
                    with zf.open(info) as src:
                        _copy(src, dest / rel, budget)
    except (FileExistsError, NotADirectoryError, IsADirectoryError) as e:
        raise BadArchive(f"archive entries conflict ({e}): a path is both a file and a folder; "
                         "re-pack the adapter dir") from e
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, NotImplementedError) as e:
        raise BadArchive(f"the .zip is corrupt or uses an unsupported feature ({e}); "
                         "re-create it with `zip -r adapter.zip <dir>`") from e


def _upload_too_large(limits: RegistryConfig) -> UploadTooLarge:
    return UploadTooLarge(f"the upload is larger than {limits.max_upload_bytes} bytes "
                          "(registry.max_upload_bytes); upload only adapter_config.json and "
                          "adapter_model.safetensors, or lower the adapter rank")


def _expands_too_much(limits: RegistryConfig) -> UploadTooLarge:
    return UploadTooLarge(f"the archive expands more than {limits.max_compression_ratio:g}x its size past "
                          f"{limits.ratio_free_bytes} bytes (registry.max_compression_ratio): trained LoRA "
                          "weights barely compress, so this is not an adapter; upload only "
                          "adapter_config.json and adapter_model.safetensors")


def _expands_too_large(limits: RegistryConfig) -> UploadTooLarge:
    return UploadTooLarge(f"the archive decompresses to more than {limits.max_unpacked_bytes} bytes "
                          "(registry.max_unpacked_bytes); "
                          "upload only adapter_config.json and adapter_model.safetensors")
