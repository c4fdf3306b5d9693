"""UploadPool: where an ingress replica runs uploads and deletes of adapters, and how many.

An upload unpacks, hashes, validates and copies up to max_upload_bytes: seconds of disk and CPU.
On asyncio's default executor it would share the threads every tenant's adapter resolution and
key checks use; here it has its own `upload_workers` threads, and one tenant holds at most
`uploads_per_tenant` of them: one more of its uploads is refused (429 + Retry-After) before its
body is read, so a tenant uploading in a loop never queues another tenant's upload behind it.

A request cancelled mid-upload (the client went away) sets the job's `cancelled` event: the
copy stops at its next chunk and its temporary files go (registry.upload's TemporaryDirectory).
The tenant's slot is held until the thread has stopped: cancelling does not free capacity early.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import AsyncIterator, Callable, TypeVar

from loraplex.ingress.errors import APIError

T = TypeVar("T")
RETRY_AFTER_S = 2


class UploadPool:
    def __init__(self, workers: int, per_tenant: int):
        self.workers, self.per_tenant = workers, per_tenant
        self.executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="adapter-upload")
        self.active: Counter[str] = Counter()  # tenant -> uploads/deletes in progress here

    @contextlib.asynccontextmanager
    async def slot(self, tenant: str) -> AsyncIterator[None]:
        """One of the tenant's `per_tenant` slots for the block, or 429 at once."""
        if self.active[tenant] >= self.per_tenant:
            raise APIError(429, f"This tenant already has {self.active[tenant]} adapter upload(s) or delete(s) in "
                                f"progress on this server, the most it may run at once "
                                f"(registry.uploads_per_tenant={self.per_tenant}); wait for them to finish and "
                                "retry.", headers={"Retry-After": str(RETRY_AFTER_S)},
                           reject_reason="429:uploads_per_tenant")
        self.active[tenant] += 1
        try:
            yield
        finally:
            self.active[tenant] -= 1
            if self.active[tenant] <= 0:
                del self.active[tenant]

    async def run(self, fn: Callable[..., T], *args, cancellable: bool = False) -> T:
        """fn(*args) on an upload thread (with `cancelled=` a threading.Event if cancellable)."""
        cancelled = threading.Event()
        call = functools.partial(fn, *args, cancelled=cancelled) if cancellable else functools.partial(fn, *args)
        future = asyncio.get_running_loop().run_in_executor(self.executor, call)
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            cancelled.set()
            # Until the thread stops (at its next chunk), the slot and its files are still in use.
            with contextlib.suppress(BaseException):
                await future
            raise

    def close(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)
