"""Attacks on the API's edges (issue 34, part B): uploads, probes, quotas, keys.

- zip_bomb: a bz2 zip a few hundred bytes long declaring 256 MiB of zeros as the adapter's weights,
  uploaded in a loop. It used to pass the size bounds (under max_unpacked_bytes), write it all to
  /tmp and burn seconds of CPU on asyncio's default pool before a 422; now its header's ratio is
  refused at once (413, registry.max_compression_ratio), and a second upload of the tenant's while
  one runs gets 429 (registry.uploads_per_tenant) on the upload pool, never the shared threads.
- readyz_hammer: unauthenticated GET /readyz from many loops. Each used to run a generation and a
  controller call and answer repr() of Ray and database errors; now one probe per
  ingress.ready_cache_s answers all of them, with the status alone.
- quota_exhaustion: a tenant with max_adapter_versions / max_adapter_bytes uploading distinct
  adapters in a loop; past the quota 409 / 413 naming it (and the fix: delete versions).
- random_key_flood: requests with random API keys (a few hundred distinct, repeated): each key
  costs one database query per tenancy.key_cache.negative_s, not one per request.

Each is `async def attack(ctx) -> AttackResult` (bench/hostile/attack.py); ATTACKS lists them.
The adapters are synthetic LoRAs for the default served model (SmolLM2-135M-Instruct's shapes).
"""

from __future__ import annotations

import asyncio
import io
import json
import secrets
import zipfile
from collections import Counter

import httpx

from bench.demo_adapters import synthetic_adapter
from bench.hostile.attack import AttackContext, AttackResult, reply_outcome

BOMB_BYTES = 256 << 20  # the zip bomb's declared (and real) unpacked size: under max_unpacked_bytes (1 GiB)
CONFIG = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": 4, "lora_alpha": 8,
          "target_modules": ["q_proj", "v_proj"], "lora_dropout": 0.0, "bias": "none"}


def bz2_zip_bomb(unpacked_bytes: int = BOMB_BYTES) -> bytes:
    """A zip whose adapter_model.safetensors member is `unpacked_bytes` zeros, bz2-compressed
    (a few hundred bytes per 256 MiB)."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_BZIP2) as zf:
        zf.writestr("adapter_config.json", json.dumps(CONFIG))
        with zf.open("adapter_model.safetensors", "w", force_zip64=True) as member:
            chunk = bytes(8 << 20)
            for _ in range(unpacked_bytes // len(chunk)):
                member.write(chunk)
    return out.getvalue()


async def _upload(ctx: AttackContext, key: str, name: str, archive: bytes, filename: str) -> str:
    try:
        r = await ctx.client.post(f"{ctx.url}/v1/adapters", headers=ctx.headers(key), data={"name": name},
                                  files={"file": (filename, archive, "application/octet-stream")}, timeout=120)
        return await reply_outcome(r)
    except httpx.HTTPError as exc:
        return f"error {type(exc).__name__}"


async def zip_bomb(ctx: AttackContext, loops: int = 3) -> AttackResult:
    bomb = await asyncio.to_thread(bz2_zip_bomb)
    _, key = await ctx.new_tenant("bomb")
    got: Counter = Counter()

    async def harm():
        async def loop(k: int):
            while True:
                got[await _upload(ctx, key, f"bomb{k}", bomb, "adapter.zip")] += 1
        await asyncio.gather(*(loop(k) for k in range(loops)))

    bystander = await ctx.bystander_during(harm)
    return AttackResult("zip_bomb", f"{loops} loops uploading a {len(bomb)}-byte bz2 zip declaring "
                        f"{BOMB_BYTES >> 20} MiB of zeros", got, bystander, ctx.alone)


async def readyz_hammer(ctx: AttackContext, loops: int = 32) -> AttackResult:
    got: Counter = Counter()
    bodies: Counter = Counter()

    async def harm():
        async def loop():
            while True:
                try:
                    r = await ctx.client.get(f"{ctx.url}/readyz")  # no key: the probe is public
                    got[f"{r.status_code} {r.text[:80]}"] += 1
                    bodies[tuple(sorted(r.json()))] += 1
                except (httpx.HTTPError, ValueError) as exc:
                    got[f"error {type(exc).__name__}"] += 1
        await asyncio.gather(*(loop() for _ in range(loops)))

    bystander = await ctx.bystander_during(harm)
    leaked = [keys for keys in bodies if keys != ("status",)]
    return AttackResult("readyz_hammer", f"{loops} loops of unauthenticated GET /readyz", got, bystander, ctx.alone,
                        notes=f"public body keys: {sorted(bodies)}" + (" (DETAILS LEAKED)" if leaked else ""))


async def quota_exhaustion(ctx: AttackContext, versions: int = 3, uploads: int = 8) -> AttackResult:
    _, key = await ctx.new_tenant("quota", max_adapter_versions=versions)
    got: Counter = Counter()
    archives = [await asyncio.to_thread(synthetic_adapter, seed) for seed in range(uploads)]

    async def harm():
        i = 0
        while True:
            got[await _upload(ctx, key, f"v{i % uploads}", archives[i % uploads], "adapter.tar.gz")] += 1
            i += 1

    bystander = await ctx.bystander_during(harm)
    return AttackResult("quota_exhaustion", f"{uploads} distinct adapters uploaded in turn under "
                        f"max_adapter_versions={versions}", got, bystander, ctx.alone)


async def random_key_flood(ctx: AttackContext, loops: int = 16, keys: int = 200) -> AttackResult:
    pool = ["lpx-" + secrets.token_urlsafe(32) for _ in range(keys)]
    got: Counter = Counter()
    body = {"model": ctx.model, "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}

    async def harm():
        async def loop(k: int):
            i = k
            while True:
                try:
                    r = await ctx.client.post(f"{ctx.url}/v1/chat/completions", json=body,
                                              headers=ctx.headers(pool[i % keys]))
                    got[await reply_outcome(r)] += 1
                except httpx.HTTPError as exc:
                    got[f"error {type(exc).__name__}"] += 1
                i += loops
        await asyncio.gather(*(loop(k) for k in range(loops)))

    bystander = await ctx.bystander_during(harm)
    return AttackResult("random_key_flood", f"{loops} loops of chat requests over {keys} random API keys",
                        got, bystander, ctx.alone,
                        notes="each distinct key costs one query per tenancy.key_cache.negative_s")


ATTACKS = [zip_bomb, readyz_hammer, quota_exhaustion, random_key_flood]
