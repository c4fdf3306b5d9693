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


def running_engines() -> int:
    from ray import serve

    return serve.status().applications[APP].deployments["Engine"].replica_states.get("RUNNING", 0)


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


def one_round(base_url, keys, model_name) -> list[tuple[int, str]]:
    sent = []
    for t, key in enumerate(keys):
        r = httpx.post(f"{base_url}/v1/chat/completions", headers={"Authorization": f"Bearer {key}"}, timeout=120,
                       json={"model": model_name, "messages": [{"role": "user", "content": f"Hi from {t}"}],
                             "max_tokens": 1})
        assert r.status_code == 200, r.text
        sent.append((t, r.headers["x-loraplex-request-id"]))
    return sent


def placement(db, sent) -> dict[int, set[str]]:
    replicas = served_by(db, [rid for _, rid in sent])
    out: dict[int, set[str]] = {}
    for t, rid in sent:
        out.setdefault(t, set()).add(replicas[rid])
    return out


def test_tenants_stick_and_removal_moves_only_its_tenants(routed, model_name):
    from ray import serve

    from loraplex.app import build_app

    base_url, state = routed
    db = make_engine(f"sqlite:///{state}/loraplex.db")
    with httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=60) as admin:
        keys = [new_tenant_key(admin, f"route-{t}") for t in range(TENANTS)]

    before = placement(db, one_round(base_url, keys, model_name) + one_round(base_url, keys, model_name))
    assert all(len(replicas) == 1 for replicas in before.values()), before  # each tenant on one replica
    home = {t: next(iter(r)) for t, r in before.items()}
    assert len(set(home.values())) >= 2, home  # and tenants spread over the pool

    # Scale 3 -> 2: Serve stops one replica; the replica counts are not in the replicas' init
    # args, so the other two keep running (same ids).
    serve.run(build_app(routed_args(state, 2)), name=APP, route_prefix=PREFIX, blocking=False)
    deadline = time.time() + 300
    while (running_engines() != 2 or len(serve.status().applications[APP].deployments["Engine"].replica_states) != 1) \
            and time.time() < deadline:
        time.sleep(1)
    time.sleep(3)  # routers hear of the removal through Serve's long poll

    after = placement(db, one_round(base_url, keys, model_name))
    now = {t: next(iter(r)) for t, r in after.items()}
    survivors = set(now.values())
    assert len(survivors) <= 2
    removed = set(home.values()) - survivors
    assert all(now[t] == home[t] for t in home if home[t] not in removed), (home, now)
    moved = {t for t in home if now[t] != home[t]}
    assert moved == {t for t in home if home[t] in removed}
