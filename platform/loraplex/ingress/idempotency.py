"""Safe client retries: the `Idempotency-Key` header (issue 48).

A client that lost its connection sends the same request again with the same key, within
`ingress.idempotency_window_s`: it gets the same reply and is billed once. Per tenant; the same key
with another body is a 422. What the first request does:
- it runs to its end even if its client goes away (a disconnect does not abort it: the retry
  collects it), and its reply (the JSON body, or every SSE byte) is kept for the window;
- a retry while it runs waits for it (up to its own deadline), then gets the reply;
- a retry after the Ingress replica running it died (its engine request was aborted: engine/
  caller_watch.py) runs it again under the same request id, whose usage record supersedes the
  aborted one's (EngineCall.resumed, accounting/ledger.py's _supersedes): billed once.

`IdempotencyRecords` is the plain logic; `IdempotencyActor` shares it between Ingress replicas (one
detached Ray actor per app, as the limiter's); `LocalIdempotency` keeps it in one process.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

HEADER = "Idempotency-Key"
MAX_KEY_CHARS = 255


def body_hash(data: dict) -> str:
    """The request body's identity: its JSON, keys sorted (spacing and key order do not count)."""
    return hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


@dataclass
class Entry:
    body: str  # body_hash of the request
    request_id: str
    owner: str  # the Ingress replica running it (its Serve actor name)
    expires_at: float
    reply: Optional[tuple[int, str, bytes]] = None  # (status, media type, bytes) once finished
    done: asyncio.Event = field(default_factory=asyncio.Event, repr=False)


@dataclass(frozen=True)
class Claim:
    """What the ingress does with a request carrying a key: `run` it (as `request_id`; `again`: a
    re-run of a request whose Ingress replica died), `replay` a finished reply, `wait` for the one
    running, or refuse a key reused with another body (`conflict`)."""

    outcome: str  # run | replay | wait | conflict
    request_id: str = ""
    again: bool = False
    reply: Optional[tuple[int, str, bytes]] = None


class IdempotencyRecords:
    def __init__(self, window_s: float, owner_alive: Callable[[str], bool], clock=time.time):
        self.window_s = window_s
        self.owner_alive = owner_alive
        self.clock = clock
        self.entries: dict[tuple[str, str], Entry] = {}

    def claim(self, tenant: str, key: str, body: str, owner: str, request_id: str) -> Claim:
        now = self.clock()
        self._expire(now)
        entry = self.entries.get((tenant, key))
        if entry is None:
            self.entries[(tenant, key)] = Entry(body, request_id, owner, now + self.window_s)
            return Claim("run", request_id)
        if entry.body != body:
            return Claim("conflict")
        if entry.reply is not None:
            return Claim("replay", entry.request_id, reply=entry.reply)
        if entry.owner != owner and not self.owner_alive(entry.owner):
            entry.owner = owner  # its Ingress replica died with it: this one runs it again
            return Claim("run", entry.request_id, again=True)
        return Claim("wait", entry.request_id)

    def finish(self, tenant: str, key: str, request_id: str, reply: Optional[tuple[int, str, bytes]]) -> None:
        """The request's end: its reply kept for the window; None (it failed with nothing to keep):
        forgotten, so a retry runs it again."""
        entry = self.entries.get((tenant, key))
        if entry is None or entry.request_id != request_id:
            return
        if reply is None:
            del self.entries[(tenant, key)]
        else:
            entry.reply, entry.expires_at = reply, self.clock() + self.window_s
        entry.done.set()

    async def wait(self, tenant: str, key: str, timeout_s: float) -> Optional[tuple[int, str, bytes]]:
        entry = self.entries.get((tenant, key))
        if entry is None:
            return None
        try:
            await asyncio.wait_for(entry.done.wait(), max(timeout_s, 0.0))
        except asyncio.TimeoutError:
            return None
        return entry.reply

    def _expire(self, now: float) -> None:
        for k in [k for k, e in self.entries.items() if e.expires_at < now and e.reply is not None]:
            del self.entries[k]


class LocalIdempotency:
    """The records in this process (one Ingress replica, unit tests)."""

    def __init__(self, window_s: float, owner_alive: Callable[[str], bool] = lambda owner: True):
        self.records = IdempotencyRecords(window_s, owner_alive)

    async def claim(self, tenant, key, body, owner, request_id) -> Claim:
        return self.records.claim(tenant, key, body, owner, request_id)

    async def finish(self, tenant, key, request_id, reply) -> None:
        self.records.finish(tenant, key, request_id, reply)

    async def wait(self, tenant, key, timeout_s) -> Optional[tuple[int, str, bytes]]:
        return await self.records.wait(tenant, key, timeout_s)


class IdempotencyActor:
    """The records shared by every Ingress replica of an app (a detached Ray actor, num_cpus=0)."""

    def __init__(self, window_s: float):
        from loraplex.engine.caller_watch import serve_actor_alive

        self.records = IdempotencyRecords(window_s, serve_actor_alive)

    def claim(self, tenant, key, body, owner, request_id) -> Claim:
        return self.records.claim(tenant, key, body, owner, request_id)

    def finish(self, tenant, key, request_id, reply) -> None:
        self.records.finish(tenant, key, request_id, reply)

    async def wait(self, tenant, key, timeout_s):
        return await self.records.wait(tenant, key, timeout_s)


class RayIdempotency:
    """LocalIdempotency's interface over the app's IdempotencyActor (created by the first replica)."""

    def __init__(self, app_name: str, window_s: float):
        import ray

        from loraplex.admission.ray_backend import NAMESPACE

        self.actor = ray.remote(IdempotencyActor).options(
            name=f"loraplex-idempotency-{app_name}", namespace=NAMESPACE, get_if_exists=True,
            lifetime="detached", num_cpus=0, max_concurrency=1000).remote(window_s)

    async def claim(self, tenant, key, body, owner, request_id) -> Claim:
        return await self.actor.claim.remote(tenant, key, body, owner, request_id)

    async def finish(self, tenant, key, request_id, reply) -> None:
        await self.actor.finish.remote(tenant, key, request_id, reply)

    async def wait(self, tenant, key, timeout_s) -> Optional[tuple[int, str, bytes]]:
        return await self.actor.wait.remote(tenant, key, timeout_s)


def check_key(value: Any) -> Optional[str]:
    """The header's key, or why it is refused."""
    if not value or len(value) > MAX_KEY_CHARS or not value.isprintable():
        return None
    return value
