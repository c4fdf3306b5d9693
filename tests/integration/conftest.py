"""One Ray Serve deployment of LoRAPlex with the real vLLM engine, shared by every integration test."""

import os
import sys
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from loopback import free_port  # noqa: E402
from model_dir import MODEL_NAME, default_model_dir  # noqa: E402
from readiness import wait_ready  # noqa: E402
from small_disk import small_disk  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import engine_pool as engine_pool_app  # noqa: E402
from tenant_keys import ADMIN_TOKEN, new_tenant_key  # noqa: E402

APP = "loraplex"
ROOT = Path(__file__).resolve().parents[2]


def this_checkout_first_on_pythonpath() -> None:
    """Ray workers (Serve replicas) inherit the driver's environment: put this checkout's package
    and root first, so replicas run the code under test even where another checkout's loraplex
    is installed in the venv."""
    ours = [str(ROOT / "platform"), str(ROOT)]
    rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in ours]
    os.environ["PYTHONPATH"] = os.pathsep.join(ours + rest)


@pytest.fixture(scope="session")
def serve_app(tmp_path_factory):
    import ray
    from ray import serve

    from loraplex.app import build_app

    this_checkout_first_on_pythonpath()
    # 2 cores: give Ray more logical CPUs than that so engine + ingress + helpers all schedule.
    ray.init(num_cpus=8, object_store_memory=256 * 1024**2, include_dashboard=False, logging_level="WARNING")
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    state = tmp_path_factory.mktemp("loraplex-state")
    # The usage spool on a disk of its own (a tmpfs), so test_disks_full.py can fill it under the
    # running platform.
    spool_disk = small_disk(state / "spool", "64m")
    spool_disk.__enter__()
    args = {
        "database_url": f"sqlite:///{state}/loraplex.db",
        "registry": {"store_url": str(state / "adapters"), "cache_dir": str(state / "cache"), "deletion_poll_s": 1},
        "tenancy": {"admin_token": ADMIN_TOKEN},
        # Next to this session's database: a spool must only ever be replayed into its own database.
        "accounting": {"spool_dir": str(state / "spool"), "flush_interval_s": 0.2},
        "engine": {
            "model": str(default_model_dir()),
            "max_model_len": 2048,
            "max_num_seqs": 16,
            "gpu_memory_utilization": 0.25,
            "dtype": "float32",
            # A small CPU tier, bounded by count and by bytes (about three demo adapters of ~1.8 MB
            # in float32), so test_adapters.py's storms really evict.
            "max_cpu_loras": 4,
            "max_cpu_lora_bytes": 6_000_000,
        },
        # A small fixed dispatch limit, so test_fair_queue can queue a tenant with a few requests.
        "engine_deployment": {"health_check_period_s": 5,
                              "fair_queue": {"dispatch_limit": 3, "newcomer_slots": 1}},
        # A small ingress bound and body deadline, so test_hostile_capacity's slow bodies could fill
        # the ingress (were a tenant's slot not taken before its body) within a short test.
        "ingress": {"num_replicas": 2, "num_cpus": 0.25, "max_ongoing_requests": 24, "body_timeout_s": 3},
        # test_batches: an idle runner looks for a batch twice a second.
        "batches": {"poll_s": 0.5},
        # SLO classes: every tenant is `standard` (the default `slo:` figures, as before); an
        # `interactive` class a tenant may name.
        "slo": {"classes": {"standard": {"ttft_p95_s": 2.5, "tpot_p95_s": 0.3},
                            "interactive": {"ttft_p95_s": 1.0, "tpot_p95_s": 0.3}}, "default_class": "standard"},
    }
    import loraplex

    @ray.remote(num_cpus=0)
    def package_dir() -> str:
        import loraplex as in_worker

        return in_worker.__file__

    assert ray.get(package_dir.remote()) == loraplex.__file__, "Ray workers import another checkout's loraplex"
    serve.run(build_app(args), name=APP, route_prefix="/", blocking=False)
    base_url = f"http://127.0.0.1:{port}"
    wait_ready(base_url)
    yield base_url, args["database_url"], state / "spool"
    serve.shutdown()
    ray.shutdown()
    spool_disk.__exit__(None, None, None)


@pytest.fixture(scope="session")
def engine_pool(serve_app, tmp_path_factory):
    """(base_url, state dir) of engine_pool.py's app, with all its replicas running; a test that
    kills or scales them waits for the pool to be whole again before it starts."""
    from ray import serve

    state = tmp_path_factory.mktemp("pool-state")
    engine_pool_app.deploy(state)
    base_url = serve_app[0].rstrip("/") + engine_pool_app.PREFIX
    wait_ready(base_url, timeout_s=900)
    yield base_url, state
    serve.delete(engine_pool_app.APP)


@pytest.fixture(scope="session")
def base_url(serve_app) -> str:
    return serve_app[0]


@pytest.fixture(scope="session")
def usage_db(serve_app):
    """The deployment's database, where the engine replicas' usage records land."""
    from loraplex.db.engine import make_engine

    return make_engine(serve_app[1])


@pytest.fixture(scope="session")
def admin(base_url):
    with httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=60) as client:
        yield client




@pytest.fixture(scope="session")
def api_key(admin) -> str:
    return new_tenant_key(admin, "integration")


@pytest.fixture(scope="session")
def client(base_url, api_key):
    """An HTTP client authenticated as the integration tenant."""
    with httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {api_key}"}, timeout=120) as c:
        yield c


@pytest.fixture(scope="session")
def engine_handle(serve_app):
    from ray import serve

    return serve.get_deployment_handle("Engine", app_name=APP)


@pytest.fixture(scope="session")
def model_name() -> str:
    return MODEL_NAME


@pytest.fixture(scope="session")
def metrics_targets(serve_app) -> list[str]:
    """Where Prometheus scrapes this deployment: every Ray node's metrics agent (`host:port`, path
    /metrics), found as loraplex.metrics.discovery finds them for any cluster."""
    from loraplex.metrics.discovery import scrape_targets

    targets = scrape_targets()
    assert targets, "no Ray node exports metrics"
    return targets
