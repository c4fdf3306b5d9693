"""The one interface every hostile-client attack has (scripts/hostile_client.py runs them).

An attack is `async def attack(ctx: AttackContext) -> AttackResult`, listed in its module's
`ATTACKS` (bench/hostile/capacity.py; bench/hostile/edges.py if present). The script builds
one AttackContext per run: two fresh tenants with keys (the attacker and a bystander), the
bystander's latency measured alone, and an HTTP client. An attack does its harm as the
attacker, runs `ctx.bystander_during(...)` around it, and returns what each side saw: every
status (and message) the attacker got, and the bystander's requests, refusals and latency
under the attack against alone.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Optional

import httpx

from bench.percentile import percentile


@dataclass
class BystanderStats:
    """The bystander's own short requests over one stretch of time."""

    requests: int = 0
    refusals: Counter = field(default_factory=Counter)  # "status message" -> count
    latencies_s: list = field(default_factory=list)
    within_slo: int = 0  # answered requests within both `slo:` targets (TTFT and TPOT)

    @property
    def refused(self) -> int:
        return sum(self.refusals.values())

    def p(self, q: float) -> Optional[float]:
        return percentile(self.latencies_s, q)


@dataclass
class AttackResult:
    name: str
    what: str  # one line: what the attacker did
    attacker: Counter = field(default_factory=Counter)  # "status message" -> count (what it got)
    bystander: BystanderStats = field(default_factory=BystanderStats)  # under the attack
    alone: Optional[BystanderStats] = None  # the bystander's baseline (the context's)
    notes: str = ""


def outcome(status: int, body: Any) -> str:
    """How a reply is counted in AttackResult.attacker: the status and, for an error, its
    message (OpenAI's error body) cut to one line."""
    message = ""
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        message = str(body["error"].get("message", ""))
    elif status >= 400 and body:
        message = str(body)
    message = " ".join(message.split())
    return f"{status} {message[:400]}".strip()


async def reply_outcome(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        body = response.text
    return outcome(response.status_code, body)


@dataclass
class AttackContext:
    url: str  # the platform's base URL, e.g. http://127.0.0.1:8000
    model: str  # the base model id
    attacker_key: str
    bystander_key: str
    attacker_tenant: str  # tenant ids
    bystander_tenant: str
    client: httpx.AsyncClient
    admin_token: Optional[str] = None
    # The bystander's load: `bystander_concurrency` closed loops of short requests (max_tokens
    # `bystander_max_tokens`), `bystander_requests` of them per measurement.
    bystander_concurrency: int = 1
    bystander_max_tokens: int = 8
    bystander_requests: int = 40
    alone: Optional[BystanderStats] = None  # measured by the script before the attacks
    run_id: str = "hostile"  # prefixes the names of tenants an attack creates (unique per run)
    # The platform's `slo:` targets: a bystander request within both counts in within_slo.
    slo_ttft_s: float = float("inf")
    slo_tpot_s: float = float("inf")
    server_bound: int = 32  # sequences one request may carry at most (the pool's engine.max_num_seqs)

    def headers(self, key: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {key}"}

    async def admin(self, method: str, path: str, body: Any = None) -> httpx.Response:
        """An admin API call (e.g. PATCH /admin/tenants/{id} to give the attacker its limits)."""
        r = await self.client.request(method, f"{self.url}{path}", json=body,
                                      headers={"Authorization": f"Bearer {self.admin_token}"})
        r.raise_for_status()
        return r

    async def new_tenant(self, name: str, **limits) -> tuple[str, str]:
        """(tenant id, API key) of a new tenant `<run_id>-<name>` with these limits: an attack
        that needs its attacker limited makes its own (a PATCH reaches other ingress replicas
        only within key_cache.refresh_s; a new key is read fresh everywhere)."""
        tenant = (await self.admin("POST", "/admin/tenants", {"name": f"{self.run_id}-{name}",
                                                              "limits": limits})).json()
        key = (await self.admin("POST", f"/admin/tenants/{tenant['id']}/keys")).json()["key"]
        return tenant["id"], key

    async def bystander_request(self, stats: BystanderStats) -> None:
        """One short streamed chat request of the bystander's, counted in `stats` (its TTFT and
        TPOT against the `slo:` targets)."""
        body = {"model": self.model, "max_tokens": self.bystander_max_tokens, "temperature": 0, "stream": True,
                "stream_options": {"include_usage": True},
                "messages": [{"role": "user", "content": "Say hello."}]}
        start = time.monotonic()
        first = end = None
        tokens = 0
        try:
            async with self.client.stream("POST", f"{self.url}/v1/chat/completions", json=body,
                                          headers=self.headers(self.bystander_key)) as r:
                if r.status_code != 200:
                    await r.aread()
                    result = await reply_outcome(r)
                else:
                    result = None
                    async for line in r.aiter_lines():
                        if not line.startswith("data: ") or line == "data: [DONE]":
                            continue
                        event = json.loads(line[len("data: "):])
                        if "error" in event:
                            result = outcome(500, event)
                        elif event.get("usage"):
                            tokens = event["usage"]["completion_tokens"]
                        elif first is None and any(c.get("delta", {}).get("content") for c in event.get("choices", [])):
                            first = time.monotonic()
                    end = time.monotonic()
        except httpx.HTTPError as exc:
            result = f"error {type(exc).__name__}"
        stats.requests += 1
        if result is not None:
            stats.refusals[result] += 1
            return
        stats.latencies_s.append(end - start)
        ttft = (first or end) - start
        tpot = (end - first) / (tokens - 1) if first is not None and tokens > 1 else 0.0
        stats.within_slo += ttft <= self.slo_ttft_s and tpot <= self.slo_tpot_s

    async def bystander(self, requests: Optional[int] = None) -> BystanderStats:
        """`requests` (default bystander_requests) short requests over the closed loops."""
        stats = BystanderStats()
        left = [requests or self.bystander_requests]

        async def loop():
            while left[0] > 0:
                left[0] -= 1
                await self.bystander_request(stats)
        await asyncio.gather(*(loop() for _ in range(self.bystander_concurrency)))
        return stats

    async def bystander_during(self, harm: Callable[[], Awaitable[Any]], warmup_s: float = 1.0) -> BystanderStats:
        """Start `harm()` (the attacker's part: it may run until cancelled), measure the bystander
        from `warmup_s` later (bystander()), then cancel harm if it still runs; the bystander's stats."""
        task = asyncio.ensure_future(harm())
        try:
            await asyncio.sleep(warmup_s)
            stats = await self.bystander()
        finally:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
        return stats


async def send_loops(ctx: AttackContext, key: str, bodies: list[tuple[str, dict]], loops: int, got: Counter,
                     headers: dict | None = None, pause_s: float = 0.2) -> None:
    """`loops` closed loops, each sending `bodies` in turn until cancelled; every outcome counted."""
    async def loop(offset: int):
        i = offset
        while True:
            path, body = bodies[i % len(bodies)]
            i += 1
            try:
                r = await ctx.client.post(f"{ctx.url}{path}", json=body,
                                          headers={**ctx.headers(key), **(headers or {})})
                got[await reply_outcome(r)] += 1
            except httpx.HTTPError as exc:
                got[f"error {type(exc).__name__}"] += 1
            await asyncio.sleep(pause_s)
    await asyncio.gather(*(loop(k) for k in range(loops)))


Attack = Callable[[AttackContext], Awaitable[AttackResult]]
