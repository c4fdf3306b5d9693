"""Tenant-affinity routing on real Engine replicas: a tenant's requests land on one replica,
scaling the pool in place keeps the running replicas, a removed replica's tenants (and only
they) move, and a joining replica takes only the new keys it wins.

A second application next to the session's, deployed from a config the way `serve deploy`
does (Serve's controller, `import_path` + `args`), scaled by the `deployments:` entry as an
operator would. Which replica served a request is read from the usage ledger (each record
names its replica); Serve's controller lists the replica ids.
"""

import httpx
import pytest
from sqlalchemy import select

from loraplex.accounting.tables import usage_records
from loraplex.db.engine import make_engine
from loraplex.routing.rendezvous import rendezvous_order
from model_dir import default_model_dir
from readiness import wait_ready
from tenant_keys import ADMIN_TOKEN, new_tenant_key
from waiting import wait_until

pytestmark = pytest.mark.integration

APP = "routing"
PREFIX = "/routing"
TENANTS = 12
REPLICAS = 2  # scaled to one fewer and back


def routing_args(state) -> dict:
    return {
        "database_url": f"sqlite:///{state}/loraplex.db",
        "registry": {"store_url": str(state / "adapters"), "cache_dir": str(state / "cache")},
        "tenancy": {"admin_token": ADMIN_TOKEN},
        "accounting": {"spool_dir": str(state / "spool"), "flush_interval_s": 0.2},
        "engine": {"model": str(default_model_dir()), "max_model_len": 2048, "max_num_seqs": 4,
                   "dtype": "float32", "engine_kwargs": {"kv_cache_memory_bytes": 128 << 20}},
        "engine_deployment": {"num_cpus": 0.5, "health_check_period_s": 5,
                              "routing": {"policy": "tenant_affinity", "stats_period_s": 2}},
        "ingress": {"num_cpus": 0.25},
    }


def deploy(state, engine_replicas: int) -> None:
    """Apply the app's config as `serve deploy` does. The replica count is in `deployments:`,
    not in `args`: Serve hashes `args` into the app's code version, so a change there replaces
    every replica, while a `deployments:` change is applied in place."""
    from ray.serve.context import _get_global_client
    from ray.serve.schema import ServeDeploySchema

    _get_global_client().deploy_apps(ServeDeploySchema(applications=[{
        "name": APP, "route_prefix": PREFIX, "import_path": "loraplex.app:build_app",
        "args": routing_args(state),
        "deployments": [{"name": "Engine", "num_replicas": engine_replicas}],
    }]))


def engine_replicas() -> dict[str, str]:
    """The routing app's Engine replicas as Serve's controller lists them: id -> state."""
    from ray.serve.context import _get_global_client

    details = _get_global_client().get_serve_details()
    app = details["applications"].get(APP)
    if not app or "Engine" not in app["deployments"]:
        return {}
    return {r["replica_id"]: r["state"] for r in app["deployments"]["Engine"]["replicas"]}


def running_exactly(n: int):
    replicas = engine_replicas()
    running = {r for r, state in replicas.items() if state == "RUNNING"}
    return running if len(running) == len(replicas) == n else None


@pytest.fixture(scope="module")
def routed(serve_app, tmp_path_factory):
    """(base_url, state dir): the routing app with REPLICAS Engine replicas."""
    from ray import serve

    state = tmp_path_factory.mktemp("routing-state")
    deploy(state, REPLICAS)
    base_url = serve_app[0].rstrip("/") + PREFIX
    wait_ready(base_url, timeout_s=900)
    wait_until(lambda: running_exactly(REPLICAS), 300, f"{REPLICAS} running Engine replicas")
    yield base_url, state
    serve.delete(APP)


def served_by(db, request_ids: list[str]) -> dict[str, tuple[str, str]]:
    """request id -> (tenant id, replica id), once every request has its usage record."""
    def rows():
        with db.connect() as conn:
            found = {r.request_id: (r.tenant_id, r.replica_id) for r in conn.execute(
                select(usage_records.c.request_id, usage_records.c.tenant_id, usage_records.c.replica_id)
                .where(usage_records.c.request_id.in_(request_ids)))}
        return found if len(found) == len(request_ids) else None
    return wait_until(rows, 30, f"usage records of {len(request_ids)} requests")


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
    """tenant index -> the replicas that served its requests in `sent`."""
    served = served_by(db, [rid for _, rid in sent])
    out: dict[int, set[str]] = {}
    for t, rid in sent:
        out.setdefault(t, set()).add(served[rid][1])
    return out


def tenant_ids(db, sent) -> dict[int, str]:
    served = served_by(db, [rid for _, rid in sent])
    return {t: served[rid][0] for t, rid in sent}


def homes(db, sent) -> dict[int, str]:
    where = placement(db, sent)
    assert all(len(replicas) == 1 for replicas in where.values()), where  # each tenant on one replica
    return {t: next(iter(r)) for t, r in where.items()}


def test_scaling_in_place_moves_only_the_tenants_it_must(routed, model_name):
    base_url, state = routed
    db = make_engine(f"sqlite:///{state}/loraplex.db")
    admin = httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=60)

    def new_tenants(first: int, n: int) -> dict[int, str]:
        return {t: new_tenant_key(admin, f"route-{t}") for t in range(first, first + n)}

    # Tenants until every one of the replicas is home to at least one, so that whichever
    # replica Serve removes, some tenants must move.
    keys: dict[int, str] = {}
    home: dict[int, str] = {}
    while len(set(home.values())) < REPLICAS and len(keys) < 4 * TENANTS:
        batch = new_tenants(len(keys), TENANTS)
        keys.update(batch)
        home.update(homes(db, one_round(base_url, batch, model_name) + one_round(base_url, batch, model_name)))
    assert len(set(home.values())) == REPLICAS, f"{len(keys)} tenants never reached all replicas: {home}"
    first = set(engine_replicas())
    assert set(home.values()) == first

    # One fewer: Serve stops one replica and keeps the others running (same ids).
    deploy(state, REPLICAS - 1)
    survivors = wait_until(lambda: running_exactly(REPLICAS - 1), 300, "Serve to scale the Engine deployment down")
    assert survivors < first, (survivors, first)
    [removed] = first - survivors
    held = {t for t in home if home[t] == removed}
    assert held, "the removed replica held no tenant"

    # Routers hear of the removal through Serve's long poll: until then a request for a moved
    # tenant may still be sent to the stopped replica.
    def routers_updated():
        sent = one_round(base_url, {t: keys[t] for t in held}, model_name, strict=False)
        return len(sent) == len(held) and removed not in set.union(*placement(db, sent).values())
    wait_until(routers_updated, 60, "every router to stop sending to the removed replica", interval_s=1)

    now = homes(db, one_round(base_url, keys, model_name))
    assert set(now.values()) == survivors
    assert {t for t in home if now[t] != home[t]} == held, (home, now)  # exactly its tenants moved

    # Back: a new replica joins; the running ones stay (same ids).
    deploy(state, REPLICAS)
    pool = wait_until(lambda: running_exactly(REPLICAS), 600, f"Serve to scale the Engine deployment to {REPLICAS}")
    assert survivors < pool, (survivors, pool)
    [joined] = pool - survivors

    # Every tenant the pool already serves stays where its prefix is cached: held keys first.
    # Routers hear of the new replica through the long poll; a fresh tenant whose rendezvous
    # order puts it first shows when they have (a fresh one each try: once routed, a key stays).
    probes = iter(range(1000, 2000))

    def router_knows_joined():
        t = next(probes)
        sent = one_round(base_url, new_tenants(t, 1), model_name)
        [(tenant, replica)] = served_by(db, [sent[0][1]]).values()
        return replica == joined if rendezvous_order(tenant, pool)[0] == joined else None
    wait_until(router_knows_joined, 120, "routers to route to the joining replica", interval_s=1)

    assert homes(db, one_round(base_url, keys, model_name)) == now  # nobody moved to it

    # New tenants go to their rendezvous winner: the joining replica takes exactly those it wins.
    fresh = new_tenants(len(keys), TENANTS)
    sent = one_round(base_url, fresh, model_name)
    landed, ids = homes(db, sent), tenant_ids(db, sent)
    assert landed == {t: rendezvous_order(ids[t], pool)[0] for t in fresh}, (landed, ids)
    admin.close()
