"""`serve run CONFIG` as an operator starts it, in its own process group, until ready."""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import readiness  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
BASE_URL = "http://127.0.0.1:8000"  # serve_config.yaml's http_options
BIN = Path(sys.executable).parent
RUN_MARK = "LORAPLEX_TEST_RUN"


def port_in_use(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def wait_ready(proc: subprocess.Popen, log_path: Path, timeout_s: float = 600) -> None:
    def exited():
        return None if proc.poll() is None else f"`serve run` exited with {proc.returncode}"

    try:
        readiness.wait_ready(BASE_URL, timeout_s, alive=exited)
    except (RuntimeError, TimeoutError) as exc:
        pytest.fail(f"{exc}:\n{log_path.read_text()[-4000:]}")


@contextmanager
def serve_run(config: str, log_path: Path, admin_token: str):
    if port_in_use(8000):
        pytest.fail("port 8000 is taken; stop whatever serves there (serve_config.yaml binds it)")
    log = open(log_path, "w")
    # A fresh local cluster, as on an operator's first run.
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["LORAPLEX_ADMIN_TOKEN"] = admin_token
    # Every process of this run (serve run, its Ray cluster, replicas, vLLM) inherits this mark:
    # the clean-up stops those and nothing else (`ray stop --force` would stop every Ray
    # cluster on the machine, also other people's).
    env[RUN_MARK] = uuid.uuid4().hex
    # This checkout's package first, also in the Ray workers `serve run` starts (they inherit it),
    # wherever another checkout's loraplex is installed in the venv.
    ours = [str(ROOT / "platform"), str(ROOT)]
    env["PYTHONPATH"] = os.pathsep.join(ours + [p for p in env.get("PYTHONPATH", "").split(os.pathsep)
                                                if p and p not in ours])
    # A process started from a background job inherits SIGINT ignored (CI runners, `cmd &`), and
    # serve run stops on SIGINT only: give it the default back.
    proc = subprocess.Popen([str(BIN / "serve"), "run", config], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                            env=env, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    proc.run_mark = env[RUN_MARK]
    try:
        wait_ready(proc, log_path)
        yield proc
    finally:
        # Ctrl-C, as an operator stops it: serve run shuts Serve and its local Ray down.
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        kill_marked(RUN_MARK, env[RUN_MARK])
        # Gone, not just signalled: the next test binds the same port.
        deadline = time.monotonic() + 60
        while (marked(RUN_MARK, env[RUN_MARK]) or port_in_use(8000)) and time.monotonic() < deadline:
            time.sleep(0.5)
        log.close()


def has_mark(pid: int, name: str, value: str) -> bool:
    try:
        return f"{name}={value}".encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False  # gone meanwhile, or not ours to read


def marked(name: str, value: str) -> list[int]:
    """The live processes whose environment has name=value (zombies have none to read)."""
    return [int(e.name) for e in Path("/proc").iterdir()
            if e.name.isdigit() and int(e.name) != os.getpid() and has_mark(int(e.name), name, value)]


def kill_marked(name: str, value: str) -> None:
    """SIGKILL every process whose environment has name=value (what a run left behind)."""
    for pid in marked(name, value):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def new_tenant_key(admin_token: str, name: str) -> str:
    """An operator's first steps: a tenant, then a key for it, over the admin API."""
    admin = {"Authorization": f"Bearer {admin_token}"}
    tenant = httpx.post(f"{BASE_URL}/admin/tenants", json={"name": name}, headers=admin, timeout=30)
    assert tenant.status_code == 201, tenant.text
    key = httpx.post(f"{BASE_URL}/admin/tenants/{tenant.json()['id']}/keys", headers=admin, timeout=30)
    assert key.status_code == 201, key.text
    return key.json()["key"]


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
                self.request_id = reply.headers["x-loraplex-request-id"]
                for line in reply.iter_lines():
                    if line.startswith("data: "):
                        self.events.append(line)
                        data = line.removeprefix("data: ")
                        if data != "[DONE]" and (usage := json.loads(data).get("usage")):
                            self.tokens = usage["completion_tokens"]
        except Exception as exc:  # a bare cut (RemoteProtocolError) or a hang (ReadTimeout)
            self.failure = exc
