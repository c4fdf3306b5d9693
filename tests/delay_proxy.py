"""DelayProxy: a TCP proxy that holds every server->client chunk for `latency_s` before passing it
on: a slow database (not a down one) for the fault drills, put between the platform and PostgreSQL.

Runs its own event loop in a thread, so a test or a driver (sync or async) can start it, change
the latency while traffic flows, and stop it. Chunks keep their order: each connection's
server->client pump sleeps until the chunk's own due time, so N replies in flight cost one
latency, not N (it models a slow network or server, not a queue)."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field


@dataclass
class DelayProxy:
    upstream_host: str
    upstream_port: int
    latency_s: float = 0.0
    host: str = "127.0.0.1"
    port: int = 0  # 0: any free port (see `port` after start)
    delayed_chunks: int = 0  # server->client chunks held for a latency > 0
    _loop: asyncio.AbstractEventLoop | None = field(default=None, repr=False)
    _server: asyncio.base_events.Server | None = field(default=None, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)

    def start(self) -> "DelayProxy":
        ready = threading.Event()
        self._loop = asyncio.new_event_loop()

        def run() -> None:
            asyncio.set_event_loop(self._loop)
            self._server = self._loop.run_until_complete(asyncio.start_server(self._accept, self.host, self.port))
            self.port = self._server.sockets[0].getsockname()[1]
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, name="delay-proxy", daemon=True)
        self._thread.start()
        ready.wait(10)
        return self

    def set_latency(self, latency_s: float) -> None:
        self.latency_s = latency_s  # read per chunk: applies to the next reply

    def url_for(self, database_url: str) -> str:
        """`database_url` with its host and port replaced by this proxy's."""
        from sqlalchemy.engine import make_url

        return make_url(database_url).set(host=self.host, port=self.port).render_as_string(hide_password=False)

    def stop(self) -> None:
        if self._loop is None:
            return

        async def close() -> None:
            self._server.close()
            for task in [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]:
                task.cancel()

        asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop = None

    def __enter__(self) -> "DelayProxy":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            server_r, server_w = await asyncio.open_connection(self.upstream_host, self.upstream_port)
        except OSError:
            client_w.close()
            return
        await asyncio.gather(self._pump(client_r, server_w, delayed=False),
                             self._pump(server_r, client_w, delayed=True), return_exceptions=True)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delayed: bool) -> None:
        # The reader stamps each chunk with its due time on arrival and a writer sends it then:
        # a chunk waits latency_s after it came, not after the one before it was sent.
        queue: asyncio.Queue = asyncio.Queue()

        async def send() -> None:
            while (item := await queue.get()) is not None:
                due, data = item
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                writer.write(data)
                await writer.drain()

        sender = asyncio.ensure_future(send())
        try:
            while data := await reader.read(65536):
                latency = self.latency_s if delayed else 0.0
                if latency > 0:
                    self.delayed_chunks += 1
                queue.put_nowait((time.monotonic() + latency, data))
            queue.put_nowait(None)
            await sender
        finally:
            sender.cancel()
            writer.close()
