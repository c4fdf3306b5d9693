"""Coalesce a stream's chunks into few Ray stream items, and cut it at its deadline.

Every Ray stream item from an Engine replica to the ingress (and every body message from the
ingress to Serve's proxy) costs a fixed ~0.3 ms of CPU on the hop, whatever its size: sent one
SSE chunk (one token) at a time, a replica would be capped far below a GPU's token rate. So a
stream's chunks are gathered into one item per window. The first chunk, and the first after a
quiet window, goes at once: coalescing never delays time to first token, and a slow stream
(one token per window or slower) sees no added latency.

The window is `window_s` (50 ms) while the replica is within its item budget, and widens under
load to `active_streams / items_per_s` (at most `max_window_s`), so the items per second one
replica sends stay near `items_per_s` however many streams it runs: past that rate each item
costs the hops more CPU than the tokens it carries.
"""

from __future__ import annotations

import asyncio
import time
from typing import AsyncIterator, Optional, TypeVar

T = TypeVar("T")


class DeadlineExceeded(TimeoutError):
    """The request's deadline passed: the source was cancelled (the engine request aborted)."""


class StreamBatcher:
    def __init__(self, window_s: float = 0.05, max_chunks: int = 64, items_per_s: float = 1000.0,
                 max_window_s: float = 0.5):
        self.window_s = window_s
        self.max_window_s = max(max_window_s, window_s)
        # window_s 0 sends every chunk alone, as it came.
        self.max_chunks = max_chunks if window_s > 0 else 1
        self.items_per_s = items_per_s
        self.active_streams = 0  # streams of this replica now: the load the window adapts to

    def window(self) -> float:
        return max(self.window_s, min(self.max_window_s, self.active_streams / self.items_per_s))

    async def batches(self, source: AsyncIterator[T], deadline: Optional[float] = None) -> AsyncIterator[list[T]]:
        """Lists of the source's items, in order; the last list holds the source's last item.

        An exception from the source is raised after the items before it were yielded. At
        `deadline` (epoch seconds) what was produced is yielded, the source is cancelled and
        DeadlineExceeded raised. Closing this generator (the client went away) cancels the
        source at its current await, so the engine request is aborted at once.
        """
        loop = asyncio.get_running_loop()
        buffer: list[T] = []
        wake = asyncio.Event()
        # idle: no batch went out within the last window, so the next chunk goes at once.
        state = {"idle": True, "done": False, "error": None, "expired": False}

        async def pump() -> None:
            try:
                async for item in source:
                    buffer.append(item)
                    if state["idle"] or len(buffer) >= self.max_chunks:
                        wake.set()
            except Exception as exc:  # handed to the consumer, after what came before it
                state["error"] = exc
            finally:
                state["done"] = True
                wake.set()

        def window_over() -> None:
            if buffer:
                wake.set()
            else:
                state["idle"] = True

        def expire() -> None:
            state["expired"] = True
            wake.set()

        self.active_streams += 1
        task = asyncio.ensure_future(pump())
        timer = None
        cutoff = None if deadline is None else loop.call_later(max(0.0, deadline - time.time()), expire)
        try:
            while True:
                await wake.wait()
                wake.clear()
                if state["expired"]:
                    if buffer:  # what was made before the deadline still goes out
                        batch = buffer[:]
                        buffer.clear()
                        yield batch
                    raise DeadlineExceeded(f"deadline passed {time.time() - deadline:.3f}s ago")
                if buffer:
                    batch = buffer[:self.max_chunks]
                    del buffer[:self.max_chunks]
                    state["idle"] = False
                    if timer is not None:
                        timer.cancel()
                    if len(buffer) >= self.max_chunks or state["done"]:
                        wake.set()  # more is ready now, or nothing more will come: don't wait
                    timer = loop.call_later(self.window(), window_over)
                    yield batch
                elif state["done"]:
                    if state["error"] is not None:
                        raise state["error"]
                    return
        finally:
            self.active_streams -= 1
            for handle in (timer, cutoff):
                if handle is not None:
                    handle.cancel()
            if not task.done():
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    pass
            aclose = getattr(source, "aclose", None)
            if aclose is not None:
                await aclose()
