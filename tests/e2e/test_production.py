"""Production behaviour of the real `serve run`, two Engine replicas: load shedding by priority
under an open-loop overload, and a graceful drain when the config is redeployed with one replica
(`serve deploy`). One platform serves both tests (an engine start costs a minute here)."""

import asyncio
import random
import secrets
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml
from sqlalchemy import select

from loraplex.accounting.ledger import UsageLedger
from loraplex.accounting.tables import usage_records
from loraplex.db.engine import make_engine

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_process import BASE_URL, BIN, ROOT, serve_run  # noqa: E402
from waiting import wait_until  # noqa: E402  (serve_process put tests/ on the path)

from bench.serve_run import serve_cli_env, set_engine_replicas  # noqa: E402
from bench.tenants import new_tenant_key  # noqa: E402

pytestmark = pytest.mark.e2e

ADMIN_TOKEN = secrets.token_urlsafe(16)
MODEL = "SmolLM2-135M-Instruct"
# Per drain stream: still running on both replicas when the redeploy lands. About 100 s here;
# `serve deploy` itself took 45-70 s to reach the controller with both engines busy on 2 cores.
TOKENS = 1000
RAY_CLI_ENV = serve_cli_env()


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
    # The survivor of the scale-down runs up to four drain streams at once: on a loaded 2-core
    # machine that ran past the default 300 s deadline (1,327 of 1,400 tokens), which is not
    # what this test is about.
    args["ingress"] = {**args.get("ingress", {}), "request_timeout_s": 900}
    set_engine_replicas(config, 2)
    args["engine_deployment"].update(
        num_cpus=0.5, graceful_shutdown_timeout_s=300,  # > a whole drain stream
        # Priority 0 may have one request in flight per replica (two replicas share two cores
        # here, so any more would slow the other tenant through the CPU, not the batch);
        # priority 100 only ever meets the hard bound of 64.
        shedding={"shed_requests": 1, "max_requests": 64},
    )
    config_path = tmp / "serve_config.yaml"
    config_path.write_text(yaml.safe_dump(config))
    with serve_run(str(config_path), tmp / "serve_run.log", ADMIN_TOKEN):
        yield config, config_path, args["database_url"], tmp


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


def test_scaling_down_drains_running_requests_and_flushes_their_records(platform):
    """Six new tenants at once: the router's load bound (min_bound 4) puts at least two on each
    replica, however their rendezvous order falls."""
    config, config_path, db_url, tmp = platform
    keys = [tenant_key(f"drain-{i}", 50) for i in range(6)]

    started = [asyncio.Event() for _ in keys]

    async def stream(client, key, i):
        events = []
        async with client.stream("POST", "/v1/chat/completions", headers={"Authorization": f"Bearer {key}"},
                                 json=body(f"Count slowly to one hundred. {i}", TOKENS, ignore_eos=True,
                                           stream=True)) as r:
            assert r.status_code == 200
            request_id = r.headers["x-loraplex-request-id"]
            async for line in r.aiter_lines():
                if line.startswith("data: "):
                    events.append(line)
                    started[i].set()
        return request_id, events

    async def run():
        async with httpx.AsyncClient(base_url=BASE_URL, timeout=300) as client:
            tasks = [asyncio.create_task(stream(client, key, i)) for i, key in enumerate(keys)]
            # Every stream under way (its first tokens out) on one of the two replicas.
            await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), 120)
            assert not any(t.done() for t in tasks), "streams ended before the scale-down"
            # Redeploy the config with one Engine replica, as an operator would.
            set_engine_replicas(config, 1)
            config_path.write_text(yaml.safe_dump(config))
            started_deploy = time.monotonic()
            deploy = await asyncio.to_thread(subprocess.run, [str(BIN / "serve"), "deploy", str(config_path)],
                                             capture_output=True, text=True, cwd=ROOT, env=RAY_CLI_ENV)
            assert deploy.returncode == 0, deploy.stderr
            print(f"\nserve deploy took {time.monotonic() - started_deploy:.1f} s")
            # The controller has the new config: the replica it removes still has streams to drain.
            assert not any(t.done() for t in tasks), "streams ended before the redeploy landed"
            return await asyncio.gather(*tasks)

    results = asyncio.run(run())
    for request_id, events in results:
        assert events[-1] == "data: [DONE]" and '"error"' not in events[-2], events[-3:]
    # One replica is left once the drained one exited; its records were flushed on the way out.
    def one_engine_left() -> bool:
        status = subprocess.run([str(BIN / "serve"), "status"], capture_output=True, text=True, env=RAY_CLI_ENV).stdout
        return "RUNNING: 1" in status.split("Engine:")[-1][:400] and "STOPPING" not in status
    wait_until(one_engine_left, 180, "the drained Engine replica to exit", interval_s=2)
    db = make_engine(db_url)
    want = {request_id for request_id, _ in results}
    with db.connect() as conn:
        rows = {r.request_id: r for r in conn.execute(select(usage_records).where(usage_records.c.request_id.in_(want)))}
    assert set(rows) == want, f"records missing after the drain: {want - set(rows)}"
    assert all(r.status == "length" and r.completion_tokens == TOKENS for r in rows.values())
    # A scale-down, not a restart: the streams ran on both replicas, and the one left is one of them.
    before = {r.replica_id for r in rows.values()}
    assert len(before) == 2, before
    with httpx.Client(base_url=BASE_URL, timeout=120) as client:
        reply = client.post("/v1/chat/completions", json=body("Hi", 2),
                            headers={"Authorization": f"Bearer {keys[0]}"})
    assert reply.status_code == 200, reply.text
    after = wait_until(lambda: replica_of(db, reply.headers["x-loraplex-request-id"]), 30, "the request's record")
    assert after in before, (after, before)
    # Nothing was left behind in a spool for someone else to replay.
    left = UsageLedger(db_url, str(tmp / "spool" / "check"), adopt_orphans=True).recover()
    assert left.inserted == 0


def replica_of(db, request_id: str) -> str | None:
    with db.connect() as conn:
        return conn.execute(select(usage_records.c.replica_id)
                            .where(usage_records.c.request_id == request_id)).scalar()
