"""Tenant-affinity routing on real Engine replicas: a tenant's requests land on one replica, and
removing a replica moves only the tenants it held.

A second application next to the session's, with three small engine replicas; which replica
served a request is read from the usage ledger (each record names its replica).
"""

import time

import httpx
import pytest
from sqlalchemy import select

from loraplex.accounting.tables import usage_records
from loraplex.db import make_engine
from model_dir import default_model_dir
from readiness import wait_ready
from tenant_keys import ADMIN_TOKEN, new_tenant_key
from waiting import wait_until

pytestmark = pytest.mark.integration

APP = "routing"
PREFIX = "/routing"
TENANTS = 12


def routed_args(state, replicas: int) -> dict:
    return {
        "database_url": f"sqlite:///{state}/loraplex.db",
        "registry": {"store_url": str(state / "adapters"), "cache_dir": str(state / "cache")},
        "tenancy": {"admin_token": ADMIN_TOKEN},
        "accounting": {"spool_dir": str(state / "spool"), "flush_interval_s": 0.2},
        "engine": {"model": str(default_model_dir()), "max_model_len": 2048, "max_num_seqs": 4,
                   "dtype": "float32", "engine_kwargs": {"kv_cache_memory_bytes": 128 << 20}},
        "engine_deployment": {"num_replicas": replicas, "num_cpus": 0.5, "health_check_period_s": 5,
                              "routing": {"policy": "tenant_affinity", "stats_period_s": 2}},
        "ingress": {"num_cpus": 0.25},
    }


@pytest.fixture(scope="module")
def routed(serve_app, tmp_path_factory):
    """(base_url, state dir): the routing app with three Engine replicas."""
    from ray import serve

    from loraplex.app import build_app

    state = tmp_path_factory.mktemp("routing-state")
    serve.run(build_app(routed_args(state, 3)), name=APP, route_prefix=PREFIX, blocking=False)
    base_url = serve_app[0].rstrip("/") + PREFIX
    wait_ready(base_url, timeout_s=900)
    yield base_url, state
    serve.delete(APP)


def served_by(db, request_ids: list[str], timeout_s: float = 20) -> dict[str, str]:
    deadline = time.time() + timeout_s
    while True:
        with db.connect() as conn:
            rows = dict(conn.execute(select(usage_records.c.request_id, usage_records.c.replica_id)
                                     .where(usage_records.c.request_id.in_(request_ids))).all())
        if len(rows) == len(request_ids) or time.time() > deadline:
            return rows
        time.sleep(0.2)


def one_round(base_url, keys: dict[int, str], model_name, strict: bool = True) -> list[tuple[int, str]]:
    """One request per tenant (index -> key): [(tenant index, request id)]. Not strict: a
    refused request is left out (while routers still learn of a removed replica)."""
    sent = []
    for t, key in keys.items():
        r = httpx.post(f"{base_url}/v1/chat/completions", headers={"Authorization": f"Bearer {key}"}, timeout=120,
                       json={"model": model_name, "messages": [{"role": "user", "content": f"Hi from {t}"}],
                             "max_tokens": 1})
        if strict:
            assert r.status_code == 200, r.text
        if r.status_code == 200:
            sent.append((t, r.headers["x-loraplex-request-id"]))
    return sent


def placement(db, sent) -> dict[int, set[str]]:
    replicas = served_by(db, [rid for _, rid in sent])
    assert len(replicas) == len(sent), "some requests have no usage record"
    out: dict[int, set[str]] = {}
    for t, rid in sent:
        out.setdefault(t, set()).add(replicas[rid])
    return out


def engine_replicas() -> dict[str, str]:
    """The routing app's Engine replicas as Serve's controller lists them: id -> state."""
    from ray.serve.context import _get_global_client

    details = _get_global_client().get_serve_details()
    replicas = details["applications"][APP]["deployments"]["Engine"]["replicas"]
    return {r["replica_id"]: r["state"] for r in replicas}


def test_tenants_stick_and_removal_moves_only_its_tenants(routed, model_name):
    from ray import serve

    from loraplex.app import build_app

    base_url, state = routed
    db = make_engine(f"sqlite:///{state}/loraplex.db")
    # Tenants until every one of the three replicas is home to at least one, so that whichever
    # replica Serve removes, some tenants must move.
    keys: dict[int, str] = {}
    home: dict[int, str] = {}
    with httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=60) as admin:
        while len(set(home.values())) < 3 and len(keys) < 4 * TENANTS:
            batch = {len(keys) + t: new_tenant_key(admin, f"route-{len(keys) + t}") for t in range(TENANTS)}
            keys.update(batch)
            before = placement(db, one_round(base_url, batch, model_name) + one_round(base_url, batch, model_name))
            assert all(len(replicas) == 1 for replicas in before.values()), before  # each tenant on one replica
            home.update({t: next(iter(r)) for t, r in before.items()})
    assert len(set(home.values())) == 3, f"{len(keys)} tenants never reached all three replicas: {home}"

    # Scale 3 -> 2: Serve stops one replica; the replica counts are not in the replicas' init
    # args, so the other two keep running (same ids).
    serve.run(build_app(routed_args(state, 2)), name=APP, route_prefix=PREFIX, blocking=False)

    def scaled_down():
        replicas = engine_replicas()
        running = {r for r, state in replicas.items() if state == "RUNNING"}
        return running if len(running) == len(replicas) == 2 else None
    survivors = wait_until(scaled_down, 300, "Serve to scale the Engine deployment to 2 running replicas")
    assert survivors < set(home.values()), (survivors, home)  # the two kept running, same ids
    [removed] = set(home.values()) - survivors
    held = {t for t in home if home[t] == removed}
    assert held, "the removed replica held no tenant"

    # Routers hear of the removal through Serve's long poll: until then a request for a moved
    # tenant may still be sent to the stopped replica.
    def routers_updated():
        sent = one_round(base_url, {t: keys[t] for t in held}, model_name, strict=False)
        return len(sent) == len(held) and removed not in set.union(*placement(db, sent).values())
    wait_until(routers_updated, 60, "every router to stop sending to the removed replica", interval_s=1)

    after = placement(db, one_round(base_url, keys, model_name))
    now = {t: next(iter(r)) for t, r in after.items()}
    assert removed not in now.values()
    assert set(now.values()) == set(home.values()) - {removed}
    moved = {t for t in home if now[t] != home[t]}
    assert moved == held, (home, now)  # exactly the removed replica's tenants moved
    assert all(now[t] == home[t] for t in home if t not in held), (home, now)  # the others stayed
