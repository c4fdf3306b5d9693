"""Tenant-affinity routing on real Engine replicas: a tenant's requests land on one replica,
scaling the pool in place keeps the running replicas, a removed replica's tenants (and only
they) move, and a joining replica takes only the new keys it wins.

On the pool of engine_pool.py (deployed from a config the way `serve deploy` does, scaled by its
`deployments:` entries as an operator would). Which replica served a request is read from the usage ledger (each record
names its replica); Serve's controller lists the replica ids.
"""

import httpx
import pytest
from sqlalchemy import select

from loraplex.accounting.tables import usage_records
from loraplex.db.engine import make_engine
from loraplex.routing.rendezvous import rendezvous_order
from engine_pool import ENGINES, deploy, deploy_whole, replicas, running_exactly, wait_whole
from tenant_keys import ADMIN_TOKEN, new_tenant_key
from waiting import wait_until

pytestmark = pytest.mark.integration

TENANTS = 12
REPLICAS = ENGINES  # scaled to one fewer and back


def engine_replicas() -> dict[str, str]:
    """The pool's Engine replicas as Serve's controller lists them: id -> state."""
    return {r["replica_id"]: r["state"] for r in replicas("Engine")}


def running_engines(n: int) -> set[str] | None:
    return running_exactly("Engine", n)


@pytest.fixture(scope="module")
def routed(engine_pool):
    """(base_url, state dir): the pool with REPLICAS Engine replicas and one Ingress replica: with
    one router, "every router has heard of the change" is one wait (each Ingress replica's router
    hears it through Serve's long poll on its own)."""
    deploy_whole(engine_pool[1], REPLICAS, ingresses=1)
    return engine_pool


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
    deploy(state, REPLICAS - 1, ingresses=1)
    survivors = wait_until(lambda: running_engines(REPLICAS - 1), 300, "Serve to scale the Engine deployment down")
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
    deploy(state, REPLICAS, ingresses=1)
    pool = wait_until(lambda: running_engines(REPLICAS), 600, f"Serve to scale the Engine deployment to {REPLICAS}")
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
