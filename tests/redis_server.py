"""A Redis server on loopback (Debian's `redis-server`) for the end-to-end tests: the store of a
fault-tolerant Ray GCS."""

import contextlib
import shutil
import socket
from typing import Iterator

from loopback import ServerUnavailable, free_port, loopback_server


def _pong(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as conn:
            conn.sendall(b"PING\r\n")
            return conn.recv(16).startswith(b"+PONG")
    except OSError:
        return False


@contextlib.contextmanager
def redis_server(timeout_s: float = 30) -> Iterator[str]:
    """Yield the address (host:port) of a fresh, memory-only Redis on 127.0.0.1; stop it afterwards."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise ServerUnavailable("redis-server is not installed (Debian: apt-get install redis-server)")
    port = free_port()
    argv = [binary, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no"]
    with loopback_server(argv, "redis-server", lambda: _pong(port), timeout_s):
        yield f"127.0.0.1:{port}"
