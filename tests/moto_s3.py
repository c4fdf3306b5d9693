"""A moto S3 server on loopback for the tests (the end-to-end stacks, the registry's unit tests)."""

import contextlib
import subprocess
import sys
from typing import Iterator

from loopback import ServerUnavailable, free_port, listening, loopback_server

SERVERS: dict[str, subprocess.Popen] = {}  # endpoint -> its moto process (a drill freezes it: SIGSTOP / SIGCONT)


@contextlib.contextmanager
def moto_s3(timeout_s: float = 60) -> Iterator[str]:
    """Yield the endpoint URL of a fresh moto S3 server on 127.0.0.1; stop it afterwards."""
    try:
        import moto.server  # noqa: F401
    except ImportError as exc:
        raise ServerUnavailable(f"moto[server] is not installed: {exc}") from exc
    port = free_port()
    argv = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    with loopback_server(argv, "moto.server", lambda: listening(port), timeout_s) as proc:
        endpoint = f"http://127.0.0.1:{port}"
        SERVERS[endpoint] = proc
        yield endpoint
