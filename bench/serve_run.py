"""`serve run CONFIG` as an operator starts it: the one lifecycle the benchmarks, the load test
and the e2e tests share (start marked, wait for /readyz, stop as Ctrl-C does, leave nothing)."""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path
from typing import Optional

import httpx

from bench.processes import BIN, ROOT, port_in_use, start_marked, stop_marked

RUN_MARK = "LORAPLEX_SERVE_RUN"  # every process of one serve run has RUN_MARK=<its mark>


def serve_cli_env() -> dict:
    """The environment for Ray's `serve` CLI against a `serve run` cluster: it starts Ray with token
    auth (the token in ~/.ray/auth_token), which the CLI sends only when told the cluster uses it."""
    return {**os.environ, "RAY_AUTH_MODE": "token"}


def set_engine_replicas(config: dict, n: int) -> dict:
    """Set the Engine replica count where an operator does: the app's `deployments:` entry."""
    app = config["applications"][0]
    engine = next(d for d in app.setdefault("deployments", []) if d["name"] == "Engine")
    engine["num_replicas"] = n
    return config


class ServeRun:
    """`serve run config` on `port` (the config's http_options), with LORAPLEX_ADMIN_TOKEN and
    `env`, on `cpus` if given (`taskset -c`: Ray, the proxy and the Ingress stay there; a pool with
    cpu_affinity moves to its own); a context manager that stops it on exit."""

    def __init__(self, config: Path, *, port: int, log_path: Path, admin_token: str,
                 env: Optional[dict] = None, cwd: Path = ROOT, mark_name: str = RUN_MARK,
                 cpus: Optional[set[int]] = None):
        if port_in_use(port):
            raise RuntimeError(f"port {port} is taken; stop whatever serves there or pick another port")
        self.port, self.log_path = port, Path(log_path)
        self.base_url = f"http://127.0.0.1:{port}"
        self.mark = (mark_name, uuid.uuid4().hex)
        self.proc = start_marked([str(BIN / "serve"), "run", str(config)], mark=self.mark, log_path=self.log_path,
                                 cwd=cwd, env={**(env or {}), "LORAPLEX_ADMIN_TOKEN": admin_token}, cpus=cpus)

    def wait_ready(self, timeout_s: float = 600) -> dict:
        """Until GET /readyz answers 200 (its JSON); RuntimeError if serve run exits first,
        TimeoutError after timeout_s, each with the log's tail."""
        deadline, last = time.time() + timeout_s, None
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"`serve run` exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                r = httpx.get(f"{self.base_url}/readyz", timeout=60)
                if r.status_code == 200:
                    return r.json()
                last = r.text[:200]
            except httpx.HTTPError as exc:
                last = repr(exc)
            time.sleep(2)
        raise TimeoutError(f"{self.base_url} not ready after {timeout_s:.0f} s: {last}\n{self.log_tail()}")

    def log_tail(self, chars: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.exists() else ""

    def stop(self, grace_s: float = 90) -> None:
        stop_marked(self.proc, self.mark, grace_s=grace_s, port=self.port)

    def __enter__(self) -> "ServeRun":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
