"""small_disk: a size-limited tmpfs mounted for one test, so a disk can really fill (ENOSPC from
the kernel, not a mock). Needs root (mount); skipped with the reason elsewhere (a failure in CI)."""

import contextlib
import os
import subprocess
from pathlib import Path

from missing import skip_or_fail


@contextlib.contextmanager
def small_disk(path: Path, size: str = "1m"):
    """A tmpfs of `size` at `path` (created), unmounted and removed on the way out."""
    path.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        skip_or_fail(f"cannot mount a tmpfs at {path} (needs root): {mounted.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)


def fill(disk: Path) -> Path:
    """Fill `disk` to the last byte with one file; returns it (delete it to free the disk)."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        for size in (1 << 20, 4096, 1):  # big writes, then the last pages' worth
            try:
                while True:
                    os.write(fd, b"\0" * size)
            except OSError:
                pass
    finally:
        os.close(fd)
    return filler
