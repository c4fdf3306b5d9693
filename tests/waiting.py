"""wait_until: poll a condition until it holds or a deadline passes (no fixed sleeps in tests)."""

import time
from typing import Callable, TypeVar

T = TypeVar("T")


def wait_until(predicate: Callable[[], T], timeout_s: float, what: str, interval_s: float = 0.2) -> T:
    """Call `predicate` until it returns something truthy, and return that. After `timeout_s`
    fail with an AssertionError naming `what` and the last value seen. An exception from the
    predicate counts as "not yet" (the last one is reported)."""
    deadline = time.monotonic() + timeout_s
    last: object = None
    while True:
        try:
            last = predicate()
            if last:
                return last
        except Exception as exc:  # noqa: BLE001 - e.g. a replica not reachable yet
            last = exc
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what} (last: {last!r})")
        time.sleep(interval_s)
