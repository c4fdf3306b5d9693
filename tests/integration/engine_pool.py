"""A second application beside the session's: two Engine replicas and an Ingress, deployed from a
config as `serve deploy` does (Serve's controller, `import_path` + `args`) and scaled by its
`deployments:` entries as an operator would. test_migration.py kills its replicas,
test_routing_replicas.py scales its Engine pool: one app for both (an app's start costs over a
minute here), the `engine_pool` fixture in conftest.py.

Routing by tenant affinity (the shipped policy); stream migration on at its default."""

from model_dir import default_model_dir
from tenant_keys import ADMIN_TOKEN

APP = "pool"
PREFIX = "/pool"
ENGINES = 2
INGRESSES = 1  # test_migration.py's Ingress drill deploys a second one
MAX_MIGRATIONS = 2  # the default; 0 turns migration off (then a cut stream ends with the error event)


def pool_args(state) -> dict:
    return {
        "database_url": f"sqlite:///{state}/loraplex.db",
        "registry": {"store_url": str(state / "adapters"), "cache_dir": str(state / "cache")},
        "tenancy": {"admin_token": ADMIN_TOKEN},
        "accounting": {"spool_dir": str(state / "spool"), "flush_interval_s": 0.2},
        "engine": {"model": str(default_model_dir()), "max_model_len": 1024, "max_num_seqs": 4,
                   "dtype": "float32", "engine_kwargs": {"kv_cache_memory_bytes": 128 << 20}},
        "engine_deployment": {"num_cpus": 0.5, "health_check_period_s": 5,
                              "routing": {"policy": "tenant_affinity", "stats_period_s": 2}},
        "ingress": {"num_cpus": 0.25, "num_replicas": INGRESSES, "max_migrations": MAX_MIGRATIONS},
    }


def deploy(state, engines: int = ENGINES, ingresses: int = INGRESSES) -> None:
    """Apply the app's config as `serve deploy` does. Replica counts are in `deployments:`, not in
    `args`: Serve hashes `args` into the app's code version, so a change there replaces every
    replica, while a `deployments:` change is applied in place."""
    from ray.serve.context import _get_global_client
    from ray.serve.schema import ServeDeploySchema

    _get_global_client().deploy_apps(ServeDeploySchema(applications=[{
        "name": APP, "route_prefix": PREFIX, "import_path": "loraplex.app:build_app", "args": pool_args(state),
        "deployments": [{"name": "Engine", "num_replicas": engines},
                        {"name": "Ingress", "num_replicas": ingresses}]}]))


def replicas(deployment: str) -> list[dict]:
    """The pool's replicas of `deployment` as Serve's controller lists them (replica_id, state, pid)."""
    from ray.serve.context import _get_global_client

    app = _get_global_client().get_serve_details()["applications"].get(APP)
    return app["deployments"][deployment]["replicas"] if app and deployment in app["deployments"] else []


def running_exactly(deployment: str, n: int) -> set[str] | None:
    """The ids of `deployment`'s replicas when exactly n are listed and all run, else None."""
    listed = replicas(deployment)
    running = {r["replica_id"] for r in listed if r["state"] == "RUNNING"}
    return running if len(running) == len(listed) == n else None


def wait_whole(engines: int = ENGINES, ingresses: int = INGRESSES, timeout_s: float = 600) -> None:
    """Until exactly `engines` Engine and `ingresses` Ingress replicas run (a killed one replaced,
    a scaling done)."""
    from waiting import wait_until

    wait_until(lambda: running_exactly("Engine", engines) and running_exactly("Ingress", ingresses), timeout_s,
               f"{engines} Engine and {ingresses} Ingress replicas of the pool running")


def deploy_whole(state, engines: int = ENGINES, ingresses: int = INGRESSES) -> None:
    """The pool deployed at these replica counts and every replica running (a killed one replaced)."""
    deploy(state, engines, ingresses)
    wait_whole(engines, ingresses)
