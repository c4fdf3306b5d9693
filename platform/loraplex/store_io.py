"""Every call to the adapter store (registry.store_url), bounded: a store that stops answering
costs a caller registry.store_timeout_s, then a 503 that names the store.

fsspec's backends have their own timeouts (s3fs: storage_options config_kwargs connect_timeout /
read_timeout), but with retries a frozen server (connections open, no reply) holds a call for
minutes, and a local or NFS path has none. So each filesystem call runs on a small thread pool of
its own and the caller waits for it at most the bound; a call still stuck then keeps its thread
until the backend gives up or the store answers, and a call queued behind busy threads is dropped
unstarted. One mechanism for the adapter blobs (store.py) and the Batch API's files (batches/files.py).

A top-level module (not in registry/): batches/ uses it too, and the config imports batches/.
"""

from __future__ import annotations

import concurrent.futures
import logging
from typing import Callable, TypeVar

from loraplex.disk_full import is_disk_full
from loraplex.errors import StatusError
from loraplex.metrics import catalog
from loraplex.metrics.sink import ProcessCounter

logger = logging.getLogger(__name__)

T = TypeVar("T")
RETRY_AFTER_S = 10  # an object store's blip or a restarted MinIO/NFS server: seconds to a minute
THREADS = 8  # per process: the calls of one store that may be stuck at once before new ones queue
READ, WRITE, DELETE = "read", "write", "delete"  # the failure counter's `operation` values
# Exceptions that are an answer from the store, not its absence: the caller handles them.
ANSWERS = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError, FileExistsError)
# Packages whose exceptions mean the store could not be reached (connection refused, reset, timed out).
CLIENT_PACKAGES = {"botocore", "aiobotocore", "aiohttp", "urllib3", "requests", "google", "gcsfs", "adlfs",
                   "azure", "fsspec"}


class AdapterStoreUnavailable(StatusError):
    """503 + Retry-After: the adapter store (adapters' weights, Batch API files) did not answer."""

    status = 503

    def __init__(self, root: str, what: str, cause: BaseException | None = None, timeout_s: float | None = None,
                 retry_after_s: int = RETRY_AFTER_S):
        why = (f"did not answer within {timeout_s:g} s (registry.store_timeout_s)" if cause is None
               else f"failed ({type(cause).__name__}: {cause})")
        super().__init__(
            f"The adapter store {root} {why}, so {what}. Retry in {retry_after_s} s; adapters already loaded "
            "on a replica and base models keep being served meanwhile.",
            code="adapter_store_unavailable", headers={"Retry-After": str(retry_after_s)},
            reject_reason="503:adapter_store_unavailable")
        self.retry_after_s = retry_after_s


def is_unreachable(exc: BaseException) -> bool:
    """Whether a filesystem call's exception means the store is not there (vs. an answer or a bug)."""
    if isinstance(exc, ANSWERS):
        return False
    if isinstance(exc, (OSError, TimeoutError)):  # ConnectionError, socket timeouts, a full or gone mount
        return True
    return type(exc).__module__.split(".")[0] in CLIENT_PACKAGES


class BoundedStore:
    """Runs one store's filesystem calls with a bound; counts each failure by operation."""

    def __init__(self, root: str, timeout_s: float, on_failure: Callable[[str], None] | None = None):
        self.root = root
        self.timeout_s = timeout_s
        self.on_failure = on_failure or count_failure
        self._pool = concurrent.futures.ThreadPoolExecutor(THREADS, thread_name_prefix="adapter-store")

    def call(self, operation: str, what: str, fn: Callable[..., T], *args, **kwargs) -> T:
        """fn(*args, **kwargs) within timeout_s, else AdapterStoreUnavailable saying `what` failed."""
        future = self._pool.submit(fn, *args, **kwargs)
        try:
            return future.result(timeout=self.timeout_s)
        except concurrent.futures.TimeoutError:
            future.cancel()  # still queued: never runs
            self.on_failure(operation)
            logger.warning("adapter store %s: a %s took over %g s; answering 503", self.root, operation, self.timeout_s)
            raise AdapterStoreUnavailable(self.root, what, timeout_s=self.timeout_s) from None
        except Exception as exc:
            if not is_unreachable(exc) or (operation == READ and is_disk_full(exc)):
                raise  # a read's full disk is the reader's (its copy's destination), not the store's
            self.on_failure(operation)
            logger.warning("adapter store %s: a %s failed: %r; answering 503", self.root, operation, exc)
            raise AdapterStoreUnavailable(self.root, what, cause=exc) from exc


FAILURES = ProcessCounter(catalog.ADAPTER_STORE_FAILURES)


def count_failure(operation: str) -> None:
    """loraplex_adapter_store_failures_total{operation} of this process (a Serve replica's labels)."""
    FAILURES.inc(operation)
