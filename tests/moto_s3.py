"""A moto S3 server on loopback for the end-to-end tests (the registry unit tests have their own
fixture in tests/unit/registry/conftest.py)."""

import contextlib
import socket
import subprocess
import sys
import time
from typing import Iterator


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MotoUnavailable(RuntimeError):
    pass


SERVERS: dict[str, subprocess.Popen] = {}  # endpoint -> its moto process (a drill freezes it: SIGSTOP / SIGCONT)


@contextlib.contextmanager
def moto_s3(timeout_s: float = 60) -> Iterator[str]:
    """Yield the endpoint URL of a fresh moto S3 server on 127.0.0.1; stop it afterwards."""
    try:
        import moto.server  # noqa: F401
    except ImportError as exc:
        raise MotoUnavailable(f"moto[server] is not installed: {exc}") from exc
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                if proc.poll() is not None:
                    raise MotoUnavailable(f"moto.server exited with {proc.returncode}")
                if time.monotonic() > deadline:
                    raise MotoUnavailable(f"moto.server did not listen within {timeout_s} s")
                time.sleep(0.2)
        endpoint = f"http://127.0.0.1:{port}"
        SERVERS[endpoint] = proc
        yield endpoint
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
