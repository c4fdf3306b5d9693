"""Waiting for a LoRAPlex deployment's /readyz, shared by the integration and e2e tests."""

import time
from typing import Callable, Optional

import httpx


def wait_ready(base_url: str, timeout_s: float = 600, alive: Optional[Callable[[], Optional[str]]] = None) -> None:
    """Until GET {base_url}/readyz answers 200. `alive()` returns a reason to stop early (e.g.
    the server process exited) or None."""
    deadline = time.time() + timeout_s
    last = None
    while time.time() < deadline:
        if alive is not None and (reason := alive()):
            raise RuntimeError(reason)
        try:
            last = httpx.get(f"{base_url}/readyz", timeout=60)
            if last.status_code == 200:
                return
        except httpx.HTTPError as exc:
            last = exc
        time.sleep(2)
    raise TimeoutError(f"{base_url} not ready after {timeout_s} s: {last!r}")
