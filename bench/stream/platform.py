"""The platform under a streaming benchmark: its args with the fake engine, deployed into a running
Serve, a tenant key, and waits (HTTP up, the token source drained)."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from typing import Any

from bench.fake_engine import BenchmarkFakeEngine
from bench.state import with_fresh_state

ADMIN = "bench-stream-admin-token"
APP = "benchstream"


def stub_model_dir(state: Path, name: str) -> Path:
    """A config.json of the served model's shape and no weights: the ingress validates adapter
    uploads against it at start-up; the fake engine reads nothing."""
    d = state / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps({
        "model_type": "llama", "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
        "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64, "vocab_size": 49152}))
    return d


def platform_args(state: Path, model_dir: Path, interval: float, streaming: dict, max_streams: int) -> dict:
    engine_deployment: dict[str, Any] = {
        # A GPU replica with a large batch takes every stream; Serve must not queue them.
        "max_ongoing_requests": max_streams + 64,
        "health_check_period_s": 30,
        # A GPU replica holds every stream in its batch: this measures streaming, not shedding
        # (the fake's streams never wait, so in-flight requests are not a queue here).
        "shedding": {"enabled": False},
        # The fair queue stays on (its per-request path is measured), its limit the batch's size.
        "fair_queue": {"dispatch_limit": max_streams},
        **streaming,
    }
    return with_fresh_state({
        "tenancy": {"admin_token": ADMIN},
        "engine": {"model": str(model_dir), "max_num_seqs": max_streams,
                   "engine_kwargs": {"benchmark_token_interval_s": interval}},
        "engine_deployment": engine_deployment,
        # One tenant opens every stream at once: past the default bound of bodies arriving at once
        # per tenant (64), the rest would be refused (429 body_reads) while the first are read.
        "ingress": {"max_ongoing_requests": max_streams + 64, "max_body_reads_per_tenant": max_streams},
    }, state)


def deploy_platform(args: dict, engine_cls: type = BenchmarkFakeEngine):
    """The platform for `args` with the fake engine, through build_platform (the one composition
    root: cluster checks and the admin-token pin included), into the running Serve."""
    from ray import serve

    from loraplex.app import build_platform

    serve.run(build_platform(args, engine_cls=engine_cls), name=APP, route_prefix="/", blocking=False)


def wait_http(base_url: str, path: str, timeout_s: float = 300) -> None:
    import httpx

    deadline = time.time() + timeout_s
    while time.time() < deadline:
        try:
            if httpx.get(base_url + path, timeout=10).status_code in (200, 405):
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{base_url}{path} not ready after {timeout_s} s")


def settle(deployment: str, timeout_s: float = 30) -> None:
    """Wait until the token source has no request left (cut streams must have been aborted)."""
    from ray import serve

    handle = serve.get_deployment_handle(deployment, app_name=APP)
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        try:
            if handle.num_unfinished_requests.remote().result(timeout_s=10) == 0:
                return
        except Exception:
            return
        time.sleep(0.2)
    print(f"  ! {deployment} still has unfinished requests after {timeout_s} s", flush=True)


def wait_port(port: int, timeout_s: float = 60) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.2)
    raise TimeoutError(f"nothing listens on {port} after {timeout_s} s")
