"""A Redis server on loopback (Debian's `redis-server`) for the end-to-end tests: the store of a
fault-tolerant Ray GCS."""

import contextlib
import shutil
import socket
import subprocess
import time
from typing import Iterator


class RedisUnavailable(RuntimeError):
    pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def redis_server(timeout_s: float = 30) -> Iterator[str]:
    """Yield the address (host:port) of a fresh, memory-only Redis on 127.0.0.1; stop it afterwards."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise RedisUnavailable("redis-server is not installed (Debian: apt-get install redis-server)")
    port = _free_port()
    proc = subprocess.Popen([binary, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5) as conn:
                    conn.sendall(b"PING\r\n")
                    if conn.recv(16).startswith(b"+PONG"):
                        break
            except OSError:
                pass
            if proc.poll() is not None:
                raise RedisUnavailable(f"redis-server exited with {proc.returncode}")
            if time.monotonic() > deadline:
                raise RedisUnavailable(f"redis-server did not answer within {timeout_s} s")
            time.sleep(0.2)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
