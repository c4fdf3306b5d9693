"""Servers on loopback for the tests: a free port, and a server process started, waited for until
it answers and stopped afterwards (moto's S3, Redis; the registry's unit tests' S3)."""

import contextlib
import socket
import subprocess
import time
from typing import Callable, Iterator, Sequence


class ServerUnavailable(RuntimeError):
    """A test's server could not be started: not installed, exited, or never answered."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return True
    except OSError:
        return False


@contextlib.contextmanager
def loopback_server(argv: Sequence[str], name: str, ready: Callable[[], bool],
                    timeout_s: float) -> Iterator[subprocess.Popen]:
    """Start `argv`, wait until `ready()` (ServerUnavailable if it exits or `timeout_s` passes),
    yield its process; terminate it afterwards (killed if it has not exited within 10 s)."""
    proc = subprocess.Popen(list(argv), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + timeout_s
        while not ready():
            if proc.poll() is not None:
                raise ServerUnavailable(f"{name} exited with {proc.returncode}")
            if time.monotonic() > deadline:
                raise ServerUnavailable(f"{name} did not answer within {timeout_s} s")
            time.sleep(0.2)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
