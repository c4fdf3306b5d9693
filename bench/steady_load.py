"""A steady load for the store drills: one request every 1/rate s, the kinds taken in turn, each
request a thread that ends on its own (the load does not wait for replies: a stuck store must not
slow the sending, or the drill would measure less load exactly when it matters)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from bench.fault_tally import Seen


@dataclass
class Kind:
    """A kind of request in the load: `make(i)` returns the i-th one's unstarted thread (a
    drill.Request or drill.Upload); `every` sends it on every `every`-th turn only (uploads)."""

    name: str
    make: Callable[[int], threading.Thread]
    every: int = 1


@dataclass
class SteadyLoad:
    kinds: list[Kind]
    rate: float  # requests per second, all kinds together
    sent: list[tuple[str, threading.Thread]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> "SteadyLoad":
        self._thread = threading.Thread(target=self._run, name="steady-load", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        turn, due = 0, time.monotonic()
        while not self._stop.is_set():
            for kind in self.kinds:
                if turn % kind.every == 0:
                    due += 1 / self.rate
                    self._stop.wait(max(0.0, due - time.monotonic()))
                    if self._stop.is_set():
                        return
                    request = kind.make(len(self.sent))
                    self.sent.append((kind.name, request))
                    request.start()
            turn += 1

    def stop(self, join_s: float = 120) -> list[Seen]:
        """Stop sending; wait up to `join_s` for the replies; what every client saw."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        deadline = time.monotonic() + join_s
        for _, request in self.sent:
            request.join(timeout=max(0.0, deadline - time.monotonic()))
        return [request.seen(kind) for kind, request in self.sent]
