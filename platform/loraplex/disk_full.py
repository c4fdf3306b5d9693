"""The node-local disks a request depends on, full: what counts as full, and the counter of it.

Three disks: the usage spool (accounting.spool_dir), the adapter cache (registry.cache_dir) and
the upload temp space (the process's temp dir, $TMPDIR). Each refuses writes the same way
(ENOSPC, or EDQUOT on a quota), and each failed write is counted in
loraplex_disk_write_failures_total{disk} of the process, which the alert rules read.

A top-level module (not in accounting/ or registry/): the ledger, the adapter store and the upload
path all count here, as store_io.py's counter is shared.
"""

from __future__ import annotations

import errno
import logging

from loraplex.errors import StatusError
from loraplex.metrics import catalog
from loraplex.metrics.sink import ProcessCounter

logger = logging.getLogger(__name__)

SPOOL_DISK, CACHE_DISK, UPLOAD_DISK = "usage_spool", "adapter_cache", "upload_temp"  # the counter's `disk`
FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


CACHE_FULL_RETRY_S = 10


class CacheDiskFull(StatusError):
    """503 + Retry-After: the node's adapter cache (registry.cache_dir) has no room for a version's
    copy, even after the replica removed its idle copies (engine/loaded_adapters.py)."""

    status = 503

    def __init__(self, cache_dir, cause: OSError):
        super().__init__(
            f"The adapter cache {cache_dir} on this engine replica's node is full ({cause.strerror}), so this adapter "
            f"version could not be loaded here. Retry in {CACHE_FULL_RETRY_S} s; adapters already loaded and base "
            "models keep being served meanwhile.",
            code="adapter_cache_full", headers={"Retry-After": str(CACHE_FULL_RETRY_S)},
            reject_reason="503:adapter_cache_full")
        self.retry_after_s = CACHE_FULL_RETRY_S


UPLOAD_FULL_RETRY_S = 30  # other uploads' temp files go when they finish (seconds to a minute)


class UploadTempFull(StatusError):
    """503 + Retry-After: the ingress replica's temp space has no room for an upload's archive or its
    unpacked files. 503 rather than 507: the space is the server's, shared by uploads in progress
    whose files go when they end, so the same request may succeed later (and clients retry a 503)."""

    status = 503

    def __init__(self, temp_dir, cause: OSError):
        super().__init__(
            f"The upload temp space {temp_dir} on this ingress replica is full ({cause.strerror}), so the upload "
            f"was not stored and nothing of it was kept. Retry in {UPLOAD_FULL_RETRY_S} s.",
            code="upload_temp_full", headers={"Retry-After": str(UPLOAD_FULL_RETRY_S)},
            reject_reason="503:upload_temp_full")


def upload_temp_full(exc: BaseException) -> UploadTempFull | None:
    """The 503 for an upload that failed on a full temp dir (counted), or None for any other failure."""
    if not is_disk_full(exc):
        return None
    import tempfile

    count_disk_full(UPLOAD_DISK, exc)
    cause = exc if isinstance(exc, OSError) else OSError(errno.ENOSPC, "No space left on device")
    return UploadTempFull(tempfile.gettempdir(), cause)


def is_disk_full(exc: BaseException | None) -> bool:
    """Whether exc, or an exception it was raised from, is a write refused for lack of space."""
    seen = 0
    while exc is not None and seen < 8:  # a short chain: wrappers of one OSError
        if isinstance(exc, OSError) and exc.errno in FULL_ERRNOS:
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


FAILURES = ProcessCounter(catalog.DISK_WRITE_FAILURES)


def count_disk_full(disk: str, exc: BaseException | None = None) -> None:
    """One failed write to `disk` in this process's counter (a Serve replica's labels)."""
    logger.debug("a write to the %s disk failed: %r", disk, exc)
    FAILURES.inc(disk)
