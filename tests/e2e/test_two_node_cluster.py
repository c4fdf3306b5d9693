"""LoRAPlex on a two-node Ray cluster on this machine (`ray start --head` + `ray start --address`,
each node with its own working, adapter-cache and spool directory), on a fresh PostgreSQL
database and a moto S3 server on loopback, deployed from a config through Serve's controller
as `serve deploy` does. One Engine replica per node (`max_replicas_per_node: 1`); the Ingress
and the HTTP proxy on the head node (two proxies cannot bind one port on one machine; a real
cluster runs `proxy_location: EveryNode`).

In order, on one cluster (an engine start costs a minute here):
1. an adapter uploaded through the ingress (head node) is fetched from S3 and served by the
   Engine replica on the other node;
2. usage from both nodes' replicas lands in PostgreSQL exactly once;
3. a SQLite database or a local adapter store is refused at deploy, with the fix;
4. Ray's GCS (fault tolerant: its tables in a Redis, as KubeRay's `gcsFaultToleranceOptions`) is
   killed under load and started again 30 s later: the running replicas answer every request and
   finish every stream meanwhile, billed once, and the app is healthy again with no operator
   action (issue 50);
5. the second node's raylet is killed: its streams move to the surviving replica and finish as
   one reply (issue 48's migration), billed once; its tenants move there and the platform keeps
   serving;

Serve's autoscaling of the pool (up under a load ramp, down after it) is a benchmark, not a CI test:
`python -m bench autoscaling` (docs/benchmarks.md).
"""

import contextlib
import json
import secrets
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
from sqlalchemy import func, select

from loraplex.accounting.tables import usage_records
from loraplex.db.engine import make_engine
from loraplex.contract import affinity_key
from loraplex.routing.rendezvous import rendezvous_order

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from demo_adapters import trained_adapter  # noqa: E402
from local_cluster import LocalRayCluster  # noqa: E402
from loopback import ServerUnavailable  # noqa: E402
from model_dir import MODEL_NAME, default_model_dir  # noqa: E402
from missing import skip_or_fail  # noqa: E402
from readiness import wait_ready  # noqa: E402
from redis_server import redis_server  # noqa: E402
from serve_process import StreamingChat, port_in_use  # noqa: E402
from shared_stores import postgres_and_s3  # noqa: E402
from waiting import wait_until  # noqa: E402

from bench.tenants import new_tenant  # noqa: E402

pytestmark = pytest.mark.e2e

PORT = 8300
BASE_URL = f"http://127.0.0.1:{PORT}"
APP = "loraplex"
BUCKET = "loraplex-cluster"
ADMIN_TOKEN = secrets.token_urlsafe(16)
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
# A fixed pool of two through Serve's autoscaling_config (min = max), as an autoscaled pool is
# deployed: Serve 2.60 hashes whether an entry has an autoscaling_config into the app's code
# version, so an operator switching between `num_replicas` and `autoscaling_config` replaces
# every replica, while changing the bounds is applied in place.
TWO = {"autoscaling_config": {"min_replicas": 2, "max_replicas": 2, "target_ongoing_requests": 1,
                              "upscale_delay_s": 2, "downscale_delay_s": 8, "look_back_period_s": 3}}
INGRESS = {"name": "Ingress", "num_replicas": 1,
           "ray_actor_options": {"num_cpus": 0.25, "resources": {"node_head": 0.01}}}


def app_args(env) -> dict:
    return {
        "database_url": env.db_url,
        "registry": {"store_url": f"s3://{BUCKET}/adapters", "storage_options": env.s3_options,
                     # Each node's own disk: the raylet of each node has its own $LORAPLEX_NODE_DIR.
                     "cache_dir": "$LORAPLEX_NODE_DIR/adapter-cache", "deletion_poll_s": 1},
        "accounting": {"spool_dir": "$LORAPLEX_NODE_DIR/spool", "flush_interval_s": 0.2},
        "engine": {"model": str(default_model_dir()), "max_model_len": 1024, "max_num_seqs": 8,
                   "dtype": "float32",
                   # eager: no torch.compile at start (each engine start costs the 2 cores a minute)
                   "engine_kwargs": {"kv_cache_memory_bytes": 128 << 20, "enforce_eager": True}},
        # min_bound 2: a replica past two requests in flight spills new ones (the default 4 keeps
        # the small load a 2-core machine can carry on one replica).
        "engine_deployment": {"num_cpus": 1, "health_check_period_s": 5, "graceful_shutdown_timeout_s": 10,
                              "routing": {"stats_period_s": 1, "min_bound": 2}},
        "ingress": {"num_cpus": 0.25},
    }


def deploy(env, engine: dict, *others: dict) -> None:
    """The whole declarative config, as `serve deploy` sends it: this app (+ others)."""
    from ray.serve.context import _get_global_client
    from ray.serve.schema import ServeDeploySchema

    ours = {"name": APP, "route_prefix": "/", "import_path": "loraplex.app:build_app", "args": app_args(env),
            "deployments": [{"name": "Engine", "max_replicas_per_node": 1, **engine}, INGRESS]}
    _get_global_client().deploy_apps(ServeDeploySchema(applications=[ours, *others]))


def serve_details() -> dict:
    from ray.serve.context import _get_global_client

    return _get_global_client().get_serve_details()


def engine_replicas() -> dict[str, tuple[str, str]]:
    """Engine replica id -> (state, node id), as Serve's controller lists them."""
    app = serve_details()["applications"].get(APP)
    if not app or "Engine" not in app["deployments"]:
        return {}
    return {r["replica_id"]: (r["state"], r.get("node_id")) for r in app["deployments"]["Engine"]["replicas"]}


def running_exactly(n: int):
    replicas = engine_replicas()
    running = {r: node for r, (state, node) in replicas.items() if state == "RUNNING"}
    return running if len(running) == len(replicas) == n else None


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """The running platform on the two-node cluster, and what the tests need to reach it."""
    tmp = tmp_path_factory.mktemp("cluster")
    pirate = trained_adapter("pirate")  # before the engines start: training wants the cores
    if port_in_use(PORT):
        pytest.fail(f"port {PORT} is taken; this test's Serve proxy binds it")
    with contextlib.ExitStack() as resources:
        stores = resources.enter_context(postgres_and_s3(BUCKET))
        db_url, endpoint, s3_options = stores.db_url, stores.endpoint, stores.storage_options
        try:
            redis = resources.enter_context(redis_server())
        except ServerUnavailable as exc:
            skip_or_fail(str(exc))
        cluster = LocalRayCluster(tmp / "nodes")
        resources.callback(cluster.shutdown)
        # The admin token only in the head node's environment, as an operator sets it where
        # `serve deploy` runs: build_app carries it to the replicas. The GCS keeps its tables in
        # Redis (GCS fault tolerance), as deploy/rayservice.yaml sets it up.
        head = cluster.start_head(num_cpus=2, resources={"node_head": 1}, env={"LORAPLEX_ADMIN_TOKEN": ADMIN_TOKEN},
                                  redis_address=redis)
        second = cluster.add_node("n2", num_cpus=2, resources={"node_n2": 1})
        from ray import serve

        cluster.connect()
        resources.callback(cluster.disconnect)  # then the cluster's processes are killed
        cluster.wait_nodes(2)
        serve.start(http_options={"host": "127.0.0.1", "port": PORT}, proxy_location="HeadOnly")
        env = SimpleNamespace(db_url=db_url, s3_options=s3_options, endpoint=endpoint, cluster=cluster,
                              head=head, second=second, pirate=pirate, db=make_engine(db_url))
        deploy(env, TWO)
        placed = wait_until(lambda: running_exactly(2), 600, "an Engine replica running on each node", interval_s=1)
        assert set(placed.values()) == {head.node_id, second.node_id}, placed
        wait_ready(BASE_URL, timeout_s=300)
        yield env


def tenants_preferring(env, replica: str, replicas, n: int, prefix: str, adapter=None) -> list[tuple[str, str]]:
    """n new tenants whose affinity key ranks `replica` first among `replicas` (an idle pool
    sends a key no replica holds to its rendezvous winner)."""
    found = []
    for i in range(40 * n):
        tenant_id, key = new_tenant(BASE_URL, ADMIN_TOKEN, f"{prefix}-{i}")
        if rendezvous_order(affinity_key(tenant_id, adapter), replicas)[0] == replica:
            found.append((tenant_id, key))
            if len(found) == n:
                return found
    raise AssertionError(f"no {n} tenants preferring {replica}")


def chat(key: str, model: str = MODEL_NAME, max_tokens: int = 4, **extra) -> httpx.Response:
    return httpx.post(f"{BASE_URL}/v1/chat/completions", headers={"Authorization": f"Bearer {key}"}, timeout=180,
                      json={"model": model, "messages": QUESTION, "max_tokens": max_tokens, "temperature": 0, **extra})


def rows_of(env, request_ids) -> dict:
    with env.db.connect() as conn:
        return {r.request_id: r for r in conn.execute(
            select(usage_records).where(usage_records.c.request_id.in_(list(request_ids))))}


def served_by(env, request_ids) -> dict[str, str]:
    """request id -> replica id, once every one of them has its usage record in PostgreSQL."""
    request_ids = list(request_ids)
    rows = wait_until(lambda: (r := rows_of(env, request_ids)) and len(r) == len(request_ids) and r, 60,
                      f"usage records of {len(request_ids)} requests in PostgreSQL")
    return {rid: row.replica_id for rid, row in rows.items()}


def test_an_adapter_uploaded_through_the_ingress_is_served_from_the_other_node(env):
    replicas = running_exactly(2)
    [remote] = [r for r, node in replicas.items() if node == env.second.node_id]
    [(tenant_id, key)] = tenants_preferring(env, remote, replicas, 1, "adapter", adapter="pirate")

    upload = httpx.post(f"{BASE_URL}/v1/adapters", headers={"Authorization": f"Bearer {key}"}, timeout=120,
                        data={"name": "pirate"},
                        files={"file": ("pirate.tar.gz", env.pirate.read_bytes(), "application/gzip")})
    assert upload.status_code == 201, upload.text  # through the Ingress, on the head node
    sha = upload.json()["sha256"]

    reply = chat(key, "pirate", max_tokens=24)
    assert reply.status_code == 200, reply.text
    text = reply.json()["choices"][0]["message"]["content"]
    assert "Ahoy" in text or "Arr" in text, text  # the adapter's own weights answered
    [replica] = served_by(env, [reply.headers["x-loraplex-request-id"]]).values()
    assert replica == remote  # ... on the second node
    # Fetched from S3 into that node's own cache; the head node's cache never saw it.
    assert (env.second.dir / "adapter-cache" / tenant_id / sha / "adapter_model.safetensors").exists()
    assert not (env.head.dir / "adapter-cache" / tenant_id / sha).exists()


def test_usage_from_both_nodes_lands_in_postgresql_exactly_once(env):
    replicas = running_exactly(2)
    tenants = [t for r in sorted(replicas) for t in tenants_preferring(env, r, replicas, 2, f"usage-{r[:6]}")]
    replies: dict[str, dict] = {}
    lock = threading.Lock()

    def send(key):
        for _ in range(3):
            reply = chat(key, max_tokens=3 + len(replies) % 3)
            assert reply.status_code == 200, reply.text
            with lock:
                replies[reply.headers["x-loraplex-request-id"]] = reply.json()["usage"]

    threads = [threading.Thread(target=send, args=(key,)) for _, key in tenants]
    [t.start() for t in threads]
    [t.join(timeout=300) for t in threads]
    assert len(replies) == 3 * len(tenants)

    served = served_by(env, replies)
    assert {replicas[r] for r in served.values()} == {env.head.node_id, env.second.node_id}  # both nodes
    rows = rows_of(env, replies)
    for request_id, usage in replies.items():
        assert (rows[request_id].prompt_tokens, rows[request_id].completion_tokens) == \
            (usage["prompt_tokens"], usage["completion_tokens"])
    with env.db.connect() as conn:  # exactly once: one row per request id, in the whole ledger
        counts = dict(conn.execute(select(usage_records.c.request_id, func.count())
                                   .where(usage_records.c.request_id.in_(list(replies)))
                                   .group_by(usage_records.c.request_id)).all())
    assert set(counts.values()) == {1} and len(counts) == len(replies)
    # Each node spooled its own replica's records on its own disk before they reached PostgreSQL.
    for node in (env.head, env.second):
        assert any(p.name.startswith("engine-") for p in (node.dir / "spool").iterdir()), node.name


def test_sqlite_or_a_local_store_on_two_nodes_is_refused_at_deploy(env, tmp_path):
    before = running_exactly(2)
    local = {"name": "local", "route_prefix": "/local", "import_path": "loraplex.app:build_app",
             "args": {**app_args(env), "database_url": f"sqlite:///{tmp_path}/loraplex.db",
                      "registry": {"store_url": str(tmp_path / "adapters")}}}
    deploy(env, TWO, local)

    def refused():
        app = serve_details()["applications"].get("local")
        return app if app and app["status"] == "DEPLOY_FAILED" else None
    app = wait_until(refused, 120, "the app with node-local state to fail its deploy")
    message = app["message"]
    assert "refuses to run this app on a multi-node Ray cluster (2 alive nodes)" in message, message
    assert "database_url is SQLite" in message and "postgresql://" in message
    assert "registry.store_url is a node-local directory" in message and "s3://" in message
    assert not app["deployments"]  # no replica ever started with it
    deploy(env, TWO)
    wait_until(lambda: "local" not in serve_details()["applications"], 60, "the refused app to be removed")
    assert running_exactly(2) == before  # the platform's replicas were never touched


GCS_DOWN_S = 30
GCS_STREAM_TOKENS = 150


@pytest.mark.drill
def test_the_gcs_restarting_keeps_the_running_replicas_serving(env):
    replicas = running_exactly(2)
    tenants = [t for r in sorted(replicas) for t in tenants_preferring(env, r, replicas, 1, f"gcs-{r[:6]}")]
    for _, key in tenants:  # each key verified by the ingress before the fault: the fault alone
        assert chat(key).status_code == 200
    streams = [StreamingChat(key, i, GCS_STREAM_TOKENS, BASE_URL, MODEL_NAME) for i, (_, key) in enumerate(tenants)]
    [s.start() for s in streams]
    wait_until(lambda: all(s.tokens >= 3 for s in streams) or any(s.failure for s in streams), 120,
               "every stream's first tokens")

    stopped = env.cluster.kill_gcs()
    killed_at = time.monotonic()
    replies: dict[str, dict] = {}
    failed = []
    while time.monotonic() - killed_at < GCS_DOWN_S:  # a steady load on both replicas while it is down
        for _, key in tenants:
            reply = chat(key)
            if reply.status_code == 200:
                replies[reply.headers["x-loraplex-request-id"]] = reply.json()["usage"]
            else:
                failed.append((reply.status_code, reply.text[:200]))
        time.sleep(0.5)
    env.cluster.restart_gcs(stopped)
    restarted_at = time.monotonic()

    assert not failed, failed  # requests to running replicas: 100% served
    for stream in streams:
        stream.join(timeout=180)
        assert stream.failure is None and stream.events[-1] == "data: [DONE]", (stream.failure, stream.events[-2:])
        assert stream.tokens == GCS_STREAM_TOKENS
    # Healthy again with no operator action: Serve's controller reports the app running, and new
    # requests are served by both replicas.
    wait_until(lambda: serve_details()["applications"][APP]["status"] == "RUNNING" and running_exactly(2), 120,
               "the app RUNNING with both Engine replicas after the GCS restart", interval_s=1)
    healthy_after_s = time.monotonic() - restarted_at
    for _, key in tenants:
        reply = chat(key)
        assert reply.status_code == 200, reply.text
        replies[reply.headers["x-loraplex-request-id"]] = reply.json()["usage"]
    served = served_by(env, [*replies, *(s.request_id for s in streams)])  # every reply billed, as received
    assert set(served.values()) == set(replicas)
    rows = rows_of(env, served)
    for request_id, usage in replies.items():
        assert (rows[request_id].prompt_tokens, rows[request_id].completion_tokens) == \
            (usage["prompt_tokens"], usage["completion_tokens"])
    for stream in streams:
        assert rows[stream.request_id].completion_tokens == GCS_STREAM_TOKENS
    print(f"\nGCS down {GCS_DOWN_S} s: {len(replies) - len(tenants)} requests served meanwhile, 0 failed, "
          f"{len(streams)} streams finished; app RUNNING {healthy_after_s:.1f} s after the GCS restart")


STREAM_TOKENS = 300


@pytest.mark.drill
def test_losing_a_node_moves_its_tenants_to_the_survivor_and_keeps_serving(env):
    replicas = running_exactly(2)
    [lost] = [r for r, node in replicas.items() if node == env.second.node_id]
    [survivor] = [r for r in replicas if r != lost]
    on_lost = tenants_preferring(env, lost, replicas, 2, "lost")
    on_survivor = tenants_preferring(env, survivor, replicas, 1, "survivor")
    # Streams running on both replicas when the node goes.
    streams = [StreamingChat(key, i, STREAM_TOKENS, BASE_URL, MODEL_NAME)
               for i, (_, key) in enumerate(on_lost + on_survivor)]
    [s.start() for s in streams]
    wait_until(lambda: all(s.tokens >= 3 for s in streams) or any(s.failure for s in streams), 120,
               "every stream's first tokens")
    assert all(s.tokens >= 3 for s in streams), [(s.tokens, s.failure) for s in streams]

    env.cluster.kill(env.second)
    for stream in streams:
        stream.join(timeout=180)
        assert not stream.is_alive(), "a stream hung after its node died"
        assert stream.failure is None, f"a stream was cut without an error event: {stream.failure!r}"
        assert stream.events[-1] == "data: [DONE]"
    lost_streams = streams[:len(on_lost)]
    for stream in streams:  # the lost node's streams move to the survivor: every one runs to its end
        assert not any("error" in json.loads(e.removeprefix("data: ")) for e in stream.events[:-1]), stream.events
        assert stream.tokens == STREAM_TOKENS, (stream.tokens, stream.events[-3:])

    # The lost replica's tenants move to the survivor once the routers drop it; a request sent
    # meanwhile may get a 503 (never a hang), then every one is served.
    refusals = []

    def served_on_survivor():
        sent = []
        for _, key in on_lost:
            reply = chat(key)
            if reply.status_code != 200:
                assert reply.status_code == 503 and reply.json()["error"]["message"], reply.text
                refusals.append(reply.status_code)
                return None
            sent.append(reply.headers["x-loraplex-request-id"])
        return set(served_by(env, sent).values()) == {survivor}
    wait_until(served_on_survivor, 120, "the lost node's tenants to be served by the surviving replica", interval_s=1)
    for _, key in on_survivor:
        assert chat(key).status_code == 200
    print(f"\nnode loss: {len(lost_streams)} streams moved to the surviving replica, "
          f"{len(refusals)} requests refused (503) before the routers dropped the lost replica")
    # The moved streams are billed once, by the survivor, for what their clients received; the
    # prompt work repeated there is recorded apart (the platform's cost).
    rows = wait_until(lambda: (r := rows_of(env, [s.request_id for s in lost_streams])) and
                      len(r) == len(lost_streams) and r, 60, "the moved streams' usage records")
    for stream in lost_streams:
        row = rows[stream.request_id]
        assert (row.status, row.completion_tokens, row.replica_id) == ("length", STREAM_TOKENS, survivor), row
        assert row.migrated_prompt_tokens > 0, row
