#!/usr/bin/env python
"""A hostile tenant against a running platform (issue 34): each attack, and what a bystander saw.

    LORAPLEX_ADMIN_TOKEN=... python scripts/hostile_client.py --url http://127.0.0.1:8000 [--only slow_bodies]

Creates tenants through the admin API (a bystander, and per attack an attacker with the limits it
assumes; names start with a run id), measures the bystander's short requests alone, then runs
each attack of bench/hostile/capacity.py (and bench/hostile/edges.py, if present) while the
bystander keeps sending, and prints per attack a table: every status and message the attacker
got, and the bystander's requests, refusals and p50/p95 latency under the attack against alone.
--out also writes the tables to a file. The tenants stay (they are in the usage ledger).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import os
import secrets
import sys
from pathlib import Path

import httpx
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.hostile.attack import AttackContext  # noqa: E402
from bench.hostile.report import render  # noqa: E402


def attacks() -> list:
    found = list(importlib.import_module("bench.hostile.capacity").ATTACKS)
    found += importlib.import_module("bench.hostile.one_request").ATTACKS
    try:
        found += importlib.import_module("bench.hostile.edges").ATTACKS
    except ModuleNotFoundError as exc:
        if exc.name != "bench.hostile.edges":
            raise
    return found


def served(config: str) -> dict:
    """The AttackContext fields a serve config sets: the `slo:` targets and the server's bound."""
    from loraplex.config import PlatformConfig
    from loraplex.ingress.request_size import server_bound
    platform = PlatformConfig.from_args(yaml.safe_load(Path(config).read_text())["applications"][0]["args"])
    return {"slo_ttft_s": platform.slo.ttft_p95_s, "slo_tpot_s": platform.slo.tpot_p95_s,
            "server_bound": server_bound(platform.engine.max_num_seqs)}


async def main(args) -> int:
    token = os.environ.get("LORAPLEX_ADMIN_TOKEN")
    if not token:
        print("set LORAPLEX_ADMIN_TOKEN to the platform's admin token", file=sys.stderr)
        return 2
    chosen = [a for a in attacks() if not args.only or a.__name__ in args.only.split(",")]
    if not chosen:
        print(f"no attack named {args.only}; known: {', '.join(a.__name__ for a in attacks())}", file=sys.stderr)
        return 2
    url = args.url.rstrip("/")
    async with httpx.AsyncClient(timeout=args.timeout_s) as client:
        ctx = AttackContext(url=url, model=args.model or "", attacker_key="", bystander_key="", attacker_tenant="",
                            bystander_tenant="", client=client, admin_token=token,
                            bystander_requests=args.bystander_requests,
                            bystander_concurrency=args.bystander_concurrency,
                            run_id=f"hostile-{secrets.token_hex(3)}", **served(args.config))
        ctx.bystander_tenant, ctx.bystander_key = await ctx.new_tenant("bystander")
        ctx.attacker_tenant, ctx.attacker_key = await ctx.new_tenant("attacker")
        if not ctx.model:
            models = (await client.get(f"{url}/v1/models", headers=ctx.headers(ctx.bystander_key))).json()
            ctx.model = models["data"][0]["id"]
        await ctx.bystander(5)  # warm up: the key cached, the prompt's prefix in vLLM
        ctx.alone = await ctx.bystander()
        out = [f"run {ctx.run_id} against {url}, model {ctx.model}; bystander: {ctx.bystander_requests} chat "
               f"requests of max_tokens {ctx.bystander_max_tokens}, {ctx.bystander_concurrency} at a time\n"]
        print(out[0])
        for attack in chosen:
            result = await attack(ctx)
            table = render(result)
            print(table, flush=True)
            out.append(table)
    if args.out:
        Path(args.out).write_text("\n".join(out))
    return 0


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default="http://127.0.0.1:8000", help="the platform's base URL")
    p.add_argument("--model", help="the base model id (default: the first of GET /v1/models)")
    p.add_argument("--only", help="comma-separated attack names (default: all)")
    p.add_argument("--bystander-requests", type=int, default=40, help="bystander requests per measurement")
    p.add_argument("--bystander-concurrency", type=int, default=1, help="bystander requests at a time")
    p.add_argument("--timeout-s", type=float, default=120.0, help="HTTP timeout of one request")
    p.add_argument("--out", help="also write the tables (markdown) here")
    p.add_argument("--config", default=str(ROOT / "serve_config.yaml"),
                   help="the platform's serve config: its slo: targets and its first base's max_num_seqs")
    return p.parse_args(argv)


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse())))
