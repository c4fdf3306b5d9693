"""`serve run CONFIG` as an operator starts it, in its own process group, until ready."""

import json
import subprocess
import sys
import threading
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.processes import BIN, ROOT, has_mark, kill_marked, marked, port_in_use  # noqa: E402,F401
from bench.serve_run import RUN_MARK, ServeRun  # noqa: E402,F401

BASE_URL = "http://127.0.0.1:8000"  # serve_config.yaml's http_options


@contextmanager
def serve_run(config: str, log_path: Path, admin_token: str):
    """bench/serve_run.py's lifecycle on port 8000 (a fresh local cluster, every process of the
    run marked; Ctrl-C to stop it, then whatever it left): yields the `serve run` process, whose
    `run_mark` is the value of RUN_MARK in its processes' environment."""
    try:
        run = ServeRun(Path(config), port=8000, log_path=log_path, admin_token=admin_token)
    except RuntimeError as exc:
        pytest.fail(str(exc))
    try:
        try:
            run.wait_ready()
        except (RuntimeError, TimeoutError) as exc:
            pytest.fail(str(exc))
        yield run.proc
    finally:
        run.stop(grace_s=60)


def local_config(tmp: Path, source: str = "serve_config.yaml", **args: dict) -> tuple[Path, str]:
    """A shipped serve config (`source`) with its state in `tmp` (SQLite, adapter store and cache,
    the ledger's spool), each of `args` merged into the app's args of that name. (Its path,
    database_url.)"""
    config = yaml.safe_load((ROOT / source).read_text())
    app_args = config["applications"][0]["args"]
    app_args["database_url"] = f"sqlite:///{tmp}/loraplex.db"
    app_args["registry"] = {"store_url": str(tmp / "adapters"), "cache_dir": str(tmp / "cache")}
    app_args["accounting"] = {**app_args.get("accounting", {}), "spool_dir": str(tmp / "spool")}
    for name, values in args.items():
        app_args[name] = {**app_args.get(name, {}), **values}
    path = tmp / "serve_config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path, app_args["database_url"]


def replica_pids(proc, deployment: str, app: str = "loraplex") -> set[int]:
    """This run's replica processes of `deployment` (Ray's process title
    `ServeReplica:<app>:<deployment>`), not another run's on the same machine."""
    out = subprocess.run(["pgrep", "-f", f"ServeReplica:{app}:{deployment}"], capture_output=True, text=True).stdout
    return {int(p) for p in out.split() if has_mark(int(p), RUN_MARK, proc.run_mark)}


class StreamingChat(threading.Thread):
    """One long streamed chat request (ignore_eos, per-chunk usage) in a thread: what its client
    received, for tests that kill something under it."""

    def __init__(self, key: str, i: int, max_tokens: int, base_url: str = BASE_URL,
                 model: str = "SmolLM2-135M-Instruct"):
        super().__init__(daemon=True)
        self.key, self.i, self.max_tokens, self.base_url, self.model = key, i, max_tokens, base_url, model
        self.events: list[str] = []
        self.tokens = 0  # completion tokens so far, from vLLM's per-chunk usage
        self.request_id = None
        self.failure = None

    def run(self):
        body = {"model": self.model, "messages": [{"role": "user", "content": f"Count to {1000 + self.i}."}],
                "max_tokens": self.max_tokens, "ignore_eos": True, "stream": True,
                "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
        try:
            with httpx.stream("POST", f"{self.base_url}/v1/chat/completions", json=body, timeout=120,
                              headers={"Authorization": f"Bearer {self.key}"}) as reply:
                if reply.status_code != 200:  # refused before it started: say by whom and why
                    raise RuntimeError(f"{reply.status_code} {dict(reply.headers)} {reply.read()[:500]!r}")
                self.request_id = reply.headers["x-loraplex-request-id"]
                for line in reply.iter_lines():
                    if line.startswith("data: "):
                        self.events.append(line)
                        data = line.removeprefix("data: ")
                        if data != "[DONE]" and (usage := json.loads(data).get("usage")):
                            self.tokens = usage["completion_tokens"]
        except Exception as exc:  # a bare cut (RemoteProtocolError) or a hang (ReadTimeout)
            self.failure = exc
