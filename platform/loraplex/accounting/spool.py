"""Append-only local spool of JSON lines, in numbered segments.

Durability: `append` is one unbuffered os.write() of a whole line into the kernel before it
returns, so the record survives the process being killed (SIGKILL, OOM, Ray replica restart)
the moment the reply can be sent. fsync is group-committed: `sync()` is called by the ledger
every `fsync_interval_s` (default 50 ms), so a power or kernel failure can lose at most that
window, while the request path never waits on the disk. `sync_mode="always"` fsyncs on every
append for deployments that want the power-loss guarantee per request (costs ~ms per request).
"""
import fcntl
import json
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

_PREFIX, _SUFFIX = "segment-", ".jsonl"


class SpoolLocked(RuntimeError):
    """Another live process owns this spool directory."""


@dataclass
class Segment:
    path: Path
    entries: list[dict] = field(default_factory=list)
    bad_lines: int = 0  # complete lines that did not parse; the file is kept aside, not deleted


class UsageSpool:
    def __init__(self, directory: str | os.PathLike, sync_mode: str = "batch"):
        if sync_mode not in ("batch", "always"):
            raise ValueError("sync_mode must be 'batch' or 'always'")
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.sync_mode = sync_mode
        self._lock_fd = os.open(self.dir / "LOCK", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            # Released by the kernel when the owner dies, so a killed replica's spool can be adopted.
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            raise SpoolLocked(f"{self.dir} is used by another process") from None
        self._lock = threading.Lock()       # guards the current fd and counters
        self._sync_lock = threading.Lock()  # keeps fsync and rotate from racing on the fd
        existing = self._segment_numbers()
        # Always start a fresh segment: an old one may end in a torn line from a crash.
        self._seq = (max(existing) + 1) if existing else 1
        self._fd = self._open(self._seq)
        self._sync_dir()
        self._lines = 0
        self._dirty = False
        self.appended = 0  # lines appended by this process, for metrics

    # -- request path -------------------------------------------------------------------------
    def append(self, entry: str, fresh_line: bool = False) -> None:
        """fresh_line: start with a newline, so that a line torn by an earlier failed write
        stays a bad line of its own instead of corrupting this one (empty lines are skipped)."""
        data = (("\n" if fresh_line else "") + entry + "\n").encode()
        with self._lock:
            if self._fd < 0:
                raise RuntimeError(f"spool {self.dir} is closed")
            view = memoryview(data)
            while view:  # regular files write fully; loop only for pathological short writes
                view = view[os.write(self._fd, view):]
            self._lines += 1
            self.appended += 1
            self._dirty = True
            if self.sync_mode == "always":
                os.fdatasync(self._fd)
                self._dirty = False

    # -- background ---------------------------------------------------------------------------
    def sync(self) -> None:
        with self._sync_lock:
            with self._lock:
                if not self._dirty:
                    return
                fd, self._dirty = self._fd, False
            os.fdatasync(fd)  # outside _lock: appends continue while the disk works

    def rotate(self) -> None:
        """Seal the current segment (if it has lines) and start the next one."""
        with self._sync_lock:
            with self._lock:
                if self._lines == 0:
                    return
                # The number moves only once the new file is open: a failed open (a full disk)
                # must not make the segment still appended to look sealed (flushed, then deleted).
                new = self._open(self._seq + 1)
                old, self._seq = self._fd, self._seq + 1
                self._fd, self._lines, self._dirty = new, 0, False
            os.fdatasync(old)
            os.close(old)
            self._sync_dir()

    def sealed(self) -> list[Path]:
        """Segments no longer appended to, oldest first (includes those of a crashed run)."""
        return [self._path(n) for n in self._segment_numbers() if n < self._seq]

    @staticmethod
    def read(path: Path) -> Segment:
        seg = Segment(path)
        raw = path.read_bytes()
        lines = raw.split(b"\n")
        # A last piece without "\n" is a write torn by a crash: never acknowledged, so dropped.
        for line in lines[:-1]:
            if not line.strip():
                continue
            try:
                seg.entries.append(json.loads(line.decode()))  # str: skips detect_encoding
            except ValueError:
                seg.bad_lines += 1
        return seg

    def discard(self, seg: Segment) -> None:
        """Called only after the segment's entries are committed to the database."""
        if seg.bad_lines:
            seg.path.rename(seg.path.with_suffix(".corrupt"))
        else:
            seg.path.unlink(missing_ok=True)

    def pending_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.dir.glob(f"{_PREFIX}*{_SUFFIX}"))

    def close(self) -> None:
        with self._sync_lock, self._lock:
            if self._fd < 0:
                return
            os.fdatasync(self._fd)
            os.close(self._fd)
            if self._lines == 0:
                self._path(self._seq).unlink(missing_ok=True)
            self._fd, self._dirty = -1, False
            os.close(self._lock_fd)

    # -- helpers ------------------------------------------------------------------------------
    def _path(self, n: int) -> Path:
        return self.dir / f"{_PREFIX}{n:012d}{_SUFFIX}"

    def _segment_numbers(self) -> list[int]:
        return sorted(int(p.name[len(_PREFIX):-len(_SUFFIX)]) for p in self.dir.glob(f"{_PREFIX}*{_SUFFIX}"))

    def _open(self, n: int) -> int:
        return os.open(self._path(n), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def _sync_dir(self) -> None:
        # A new segment's directory entry must be durable too, or its fsync'd data is orphaned.
        dir_fd = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
