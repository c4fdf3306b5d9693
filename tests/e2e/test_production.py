"""Production behaviour of the real `serve run`, two Engine replicas: load shedding by priority
under an open-loop overload. The graceful drain of a scale-down or a redeploy (`serve deploy`
during long streams) is a drill: `python -m bench drill --drills scale-down,redeploy`
(docs/operations.md), not a CI test."""

import asyncio
import random
import secrets
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml
sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_process import BASE_URL, ROOT, serve_run  # noqa: E402

from bench.serve_run import set_engine_replicas  # noqa: E402
from bench.tenants import new_tenant_key  # noqa: E402

pytestmark = pytest.mark.e2e

ADMIN_TOKEN = secrets.token_urlsafe(16)
MODEL = "SmolLM2-135M-Instruct"


def tenant_key(name: str, priority: int) -> str:
    return new_tenant_key(BASE_URL, ADMIN_TOKEN, name, {"priority": priority})


def body(text: str, max_tokens: int, **extra) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens,
            "temperature": 0, **extra}


def p95(values: list[float]) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(0.95 * len(values)))]


@pytest.fixture(scope="module")
def platform(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("production")
    config = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    args = config["applications"][0]["args"]
    args["database_url"] = f"sqlite:///{tmp}/loraplex.db"
    args["registry"] = {"store_url": str(tmp / "adapters"), "cache_dir": str(tmp / "cache")}
    args["accounting"] = {"spool_dir": str(tmp / "spool"), "flush_interval_s": 0.2}
    args["engine"]["max_num_seqs"] = 4
    set_engine_replicas(config, 2)
    args["engine_deployment"].update(
        num_cpus=0.5,
        # Priority 0 may have one request in flight per replica (two replicas share two cores
        # here, so any more would slow the other tenant through the CPU, not the batch);
        # priority 100 only ever meets the hard bound of 64.
        shedding={"shed_requests": 1, "max_requests": 64},
    )
    config_path = tmp / "serve_config.yaml"
    config_path.write_text(yaml.safe_dump(config))
    with serve_run(str(config_path), tmp / "serve_run.log", ADMIN_TOKEN):
        yield


def test_overload_sheds_the_low_priority_tenant_and_keeps_the_high_one_fast(platform):
    gold, bronze = tenant_key("gold", 100), tenant_key("bronze", 0)

    async def timed(client, key, payload):
        started = time.monotonic()
        reply = await client.post("/v1/chat/completions", json=payload, headers={"Authorization": f"Bearer {key}"})
        return reply, time.monotonic() - started

    async def run():
        async with httpx.AsyncClient(base_url=BASE_URL, timeout=120,
                                     limits=httpx.Limits(max_connections=200)) as client:
            await timed(client, gold, body("Name a color.", 16))  # warm-up: prefix cache, first batch
            unloaded = [(await timed(client, gold, body(f"Name a color. {i}", 16)))[1] for i in range(8)]

            # Open loop: Poisson arrivals of the low-priority tenant for 25 s, at a rate several
            # times what two CPU replicas serve (about 2 requests/s of this size).
            rng, bronze_tasks, stop = random.Random(7), [], time.monotonic() + 25

            async def flood():
                while time.monotonic() < stop and len(bronze_tasks) < 300:
                    bronze_tasks.append(asyncio.create_task(
                        timed(client, bronze, body(f"Write a poem about rivers. {len(bronze_tasks)}", 32))))
                    await asyncio.sleep(rng.expovariate(6.0))

            async def gold_loop():
                await asyncio.sleep(3)  # let the overload build
                loaded = []
                while time.monotonic() < stop:
                    reply, seconds = await timed(client, gold, body(f"Name a color. {len(loaded)}", 16))
                    assert reply.status_code == 200, reply.text
                    loaded.append(seconds)
                return loaded

            _, loaded = await asyncio.gather(flood(), gold_loop())
            bronze_results = await asyncio.gather(*bronze_tasks)
            return unloaded, loaded, bronze_results

    unloaded, loaded, bronze_results = asyncio.run(run())
    statuses = [reply.status_code for reply, _ in bronze_results]
    shed = [reply for reply, _ in bronze_results if reply.status_code == 503]
    print(f"\nbronze: {len(statuses)} offered, {statuses.count(200)} served, {len(shed)} shed; "
          f"gold p95 unloaded {p95(unloaded):.2f}s, under load {p95(loaded):.2f}s ({len(loaded)} requests)")
    assert set(statuses) <= {200, 503}, statuses
    assert shed and all(int(r.headers["retry-after"]) >= 1 for r in shed)
    assert all(r.json()["error"]["code"] == 503 for r in shed)
    assert statuses.count(200) > 0  # shed, not starved: it still gets what fits
    # Without shedding and priority scheduling, gold would queue behind the flood (tens of
    # requests): its latency would grow tenfold and more. The 2x target is measured, not
    # asserted, by the overload benchmark (timing targets live in benchmarks).
    assert len(loaded) >= 5 and p95(loaded) <= 4 * p95(unloaded)
