"""Ray Serve in this process, for the scenarios that deploy the platform (build_platform with a fake or
the real engine) or a bare app themselves and measure it from here: one local cluster, Serve's proxy
on a free loopback port, both shut down on exit. `serve run` of a config is bench/serve_run.py."""

from __future__ import annotations

import contextlib
import os
from typing import Iterator, Optional

from bench.processes import free_port


@contextlib.contextmanager
def local_serve(*, admin_token: Optional[str] = None, num_cpus: int = 8,
                object_store_memory: int = 200_000_000, runtime_env: Optional[dict] = None) -> Iterator[int]:
    """Serve's HTTP port. `admin_token` is put in the environment (replicas inherit it; it wins over
    the config). Ray runs workers at nice 15: the client here (nice 0) and anything else on the
    machine would take the cores from the replicas first; at niceness 0 they compete on equal terms."""
    import ray
    from ray import serve

    if admin_token:
        os.environ["LORAPLEX_ADMIN_TOKEN"] = admin_token
    os.environ.setdefault("RAY_worker_niceness", "0")
    ray.init(num_cpus=num_cpus, object_store_memory=object_store_memory, include_dashboard=False,
             logging_level="ERROR", log_to_driver=False, runtime_env=runtime_env)
    try:
        port = free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        yield port
    finally:
        serve.shutdown()
        ray.shutdown()
