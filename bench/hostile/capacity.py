"""Attacks on capacity (issue 34, the two confirmed ones): a tenant taking more of the engine or
the ingress than its limits say.

- wide_requests: `n` choices and batched prompts. Each request asked for many sequences used to
  count as one for max_concurrent_requests, the fair queue and the shedder, and was charged once.
  Now the caps (max_n, max_prompts_per_request, max_tokens_per_request, max_sequences_per_request,
  and max_concurrent_requests as the most sequences at once) refuse them with 400 naming the cap.
- slow_bodies: many connections, each declaring a large Content-Length and sending a byte now
  and then. They used to hold ingress slots (GenerationBound) for free until the proxy's timeout;
  now the tenant's concurrency slot is taken before the body is read (the rest get 429 at once)
  and a body must arrive within ingress.body_timeout_s (408).

Each is `async def attack(ctx) -> AttackResult` (bench/hostile/attack.py); ATTACKS lists them.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections import Counter
from urllib.parse import urlsplit

import httpx

from bench.hostile.attack import AttackContext, AttackResult, outcome, send_loops

# The attacker's limits for wide_requests: what a plan would cap.
WIDE_LIMITS = {"max_n": 4, "max_prompts_per_request": 8, "max_tokens_per_request": 256,
               "max_sequences_per_request": 8, "max_concurrent_requests": 4}


def wide_bodies(model: str) -> list[tuple[str, dict]]:
    """(path, body) of requests each over one of WIDE_LIMITS."""
    chat = {"model": model, "messages": [{"role": "user", "content": "Tell me a story."}], "max_tokens": 64}
    return [
        ("/v1/chat/completions", {**chat, "n": 24}),  # over max_n
        ("/v1/completions", {"model": model, "prompt": ["Once upon a time"] * 200, "max_tokens": 16}),  # prompts
        ("/v1/chat/completions", {**chat, "max_tokens": 1500}),  # over max_tokens_per_request
        ("/v1/completions", {"model": model, "prompt": ["a", "b", "c"], "n": 3, "max_tokens": 16}),  # 9 sequences
        ("/v1/completions", {"model": model, "prompt": ["a", "b", "c", "d", "e"], "max_tokens": 16}),  # 5 > 4 at once
    ]


async def wide_requests(ctx: AttackContext, loops: int = 2, pause_s: float = 0.2) -> AttackResult:
    _, key = await ctx.new_tenant("wide", **WIDE_LIMITS)
    got: Counter = Counter()
    bodies = wide_bodies(ctx.model)
    bystander = await ctx.bystander_during(lambda: send_loops(ctx, key, bodies, loops, got, pause_s=pause_s))
    return AttackResult("wide_requests", "chat n=24, 200 prompts, max_tokens 1500, 3 prompts x n=3, 5 prompts "
                        f"(limits {json.dumps(WIDE_LIMITS)})", got, bystander, ctx.alone)


async def slow_body(host: str, port: int, key: str, path: str, content_length: int, trickle_s: float) -> str:
    """One connection declaring `content_length` bytes and sending one every `trickle_s`; the
    reply's outcome (status and message) when the server answers."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write((f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: Bearer {key}\r\n"
                      f"Content-Type: application/json\r\nContent-Length: {content_length}\r\n\r\n{{").encode())
        await writer.drain()
        while True:
            try:
                status_line = await asyncio.wait_for(reader.readline(), trickle_s)
                break
            except asyncio.TimeoutError:
                writer.write(b" ")
                await writer.drain()
        if not status_line:
            return "closed"
        status = int(status_line.split()[1])
        length = 0
        while (line := await reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode().partition(":")
            if name.strip().lower() == "content-length":
                length = int(value)
        raw = await reader.readexactly(length) if length else b""
        try:
            body = json.loads(raw)
        except ValueError:
            body = raw.decode(errors="replace")
        return outcome(status, body)
    finally:
        writer.close()


async def slow_bodies(ctx: AttackContext, connections: int = 300, trickle_s: float = 1.0, reconnect_s: float = 5.0,
                      content_length: int = 1_000_000, max_concurrent_requests: int = 4) -> AttackResult:
    """`connections` (more than an ingress replica's default 256 slots) trickling bodies."""
    _, key = await ctx.new_tenant("slow", max_concurrent_requests=max_concurrent_requests)
    # One ordinary request first, so every connection meets the body path with a verified key (a
    # new key's first lookups, all at once, are the key cache's matter, not this attack's).
    warm = {"model": ctx.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    for _ in range(8):  # reach every ingress replica (the proxy spreads them)
        await ctx.client.post(f"{ctx.url}/v1/chat/completions", json=warm, headers=ctx.headers(key))
    url = urlsplit(ctx.url)
    host, port = url.hostname, url.port or 80
    got: Counter = Counter()

    async def harm():
        async def connection(k: int):
            await asyncio.sleep(k * trickle_s / connections)  # opened over the first trickle_s
            while True:
                try:
                    got[await slow_body(host, port, key, "/v1/chat/completions", content_length,
                                        trickle_s)] += 1
                except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
                    got[f"error {type(exc).__name__}"] += 1
                await asyncio.sleep(reconnect_s * random.uniform(0.5, 1.5))  # not all at once again
        await asyncio.gather(*(connection(k) for k in range(connections)))

    bystander = await ctx.bystander_during(harm, warmup_s=2.0)
    return AttackResult("slow_bodies", f"{connections} connections, Content-Length {content_length}, a byte every "
                        f"{trickle_s:g} s, reconnecting {reconnect_s:g} s after each answer "
                        f"(max_concurrent_requests {max_concurrent_requests})", got, bystander, ctx.alone)


ATTACKS = [wide_requests, slow_bodies]
