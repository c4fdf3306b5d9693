"""A Ray cluster of several nodes on this machine, as an operator starts one: `ray start --head`
plus `ray start --address` per extra node, each its own process tree, working directory and
environment ($LORAPLEX_NODE_DIR: that node's disk). Killing a node kills its raylet, then every
process it started (the machine gone). A head started with a Redis for its GCS (Ray's GCS fault
tolerance, as KubeRay's `gcsFaultToleranceOptions`) can have its GCS killed and started again.
Only this cluster's processes are ever stopped: each node's processes carry a mark in their
environment (never `ray stop`, which stops every Ray cluster on the machine)."""

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from loopback import free_port  # noqa: E402
from serve_process import has_mark, kill_marked, marked  # noqa: E402

BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parents[2]
NODE_MARK = "LORAPLEX_TEST_NODE"
NODE_DIR = "LORAPLEX_NODE_DIR"


@dataclass
class StoppedGcs:
    """A killed GCS server and what starts it again as it was: its command line, environment
    (the node's mark included) and working directory."""
    cmd: list[str]
    env: dict[str, str]
    cwd: str


@dataclass
class RayNode:
    name: str
    dir: Path
    mark: str
    proc: subprocess.Popen
    node_id: Optional[str] = None
    log: Path = field(default=None)
    blocking: bool = True  # `ray start --block`: the start process lives as long as the node

    def pids(self) -> list[int]:
        return marked(NODE_MARK, self.mark)

    def raylet_pids(self) -> list[int]:
        out = subprocess.run(["pgrep", "-f", "raylet/raylet"], capture_output=True, text=True).stdout
        return [int(p) for p in out.split() if has_mark(int(p), NODE_MARK, self.mark)]


class LocalRayCluster:
    def __init__(self, base: Path, env: Optional[dict[str, str]] = None):
        self.base = base
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.nodes: list[RayNode] = []
        self.run = uuid.uuid4().hex[:8]
        # Ray's session dir holds Unix sockets, whose paths must stay under 108 bytes: not under
        # pytest's deep tmp dirs.
        self.temp_dir = Path(tempfile.mkdtemp(prefix="lpx-ray-", dir="/tmp"))
        # This checkout's package first in every worker (they inherit the raylet's environment).
        ours = [str(ROOT / "platform"), str(ROOT)]
        base_env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS",)}
        base_env["PYTHONPATH"] = os.pathsep.join(
            ours + [p for p in base_env.get("PYTHONPATH", "").split(os.pathsep) if p and p not in ours])
        # A private loopback cluster: no token to share with the machine's other clusters.
        base_env["RAY_AUTH_MODE"] = "disabled"
        # Every node of this cluster shares one machine's cores, which no real cluster does: each
        # Engine replica would take its node's cores (engine/cpu_backend.py), several times over.
        # One thread each, as an operator's OMP_NUM_THREADS (it wins over the share).
        base_env.setdefault("OMP_NUM_THREADS", "1")
        self.env = {**base_env, **(env or {})}

    def _start(self, name: str, args: list[str], env: dict[str, str], block: bool = True) -> RayNode:
        node_dir = self.base / name
        node_dir.mkdir(parents=True, exist_ok=True)
        mark = f"{self.run}-{name}"
        env = {**self.env, **env, NODE_MARK: mark, NODE_DIR: str(node_dir)}
        log = node_dir / "ray_start.log"
        proc = subprocess.Popen(
            [str(BIN / "ray"), "start", *(["--block"] if block else []), "--disable-usage-stats", "--node-ip-address=127.0.0.1",
             f"--object-store-memory={128 << 20}", *args],
            cwd=node_dir, env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True)
        node = RayNode(name, node_dir, mark, proc, log=log, blocking=block)
        self.nodes.append(node)
        return node

    def start_head(self, num_cpus: float, resources: dict, env: Optional[dict] = None,
                   redis_address: Optional[str] = None) -> RayNode:
        """redis_address: the GCS keeps its tables there (`RAY_REDIS_ADDRESS`), so it may die and
        start again. Such a head is started without `--block`, whose watch would take every process
        of the node down with the GCS (a Kubernetes head pod restarts its GCS instead)."""
        import json

        env = dict(env or {})
        if redis_address:
            env.update(RAY_REDIS_ADDRESS=redis_address, RAY_external_storage_namespace=self.run)
        return self._start("head", [
            "--head", f"--port={self.port}", "--include-dashboard=false",
            f"--ray-client-server-port={free_port()}", f"--num-cpus={num_cpus}",
            f"--resources={json.dumps(resources)}", f"--temp-dir={self.temp_dir}",
        ], env, block=not redis_address)

    def add_node(self, name: str, num_cpus: float, resources: dict, env: Optional[dict] = None) -> RayNode:
        import json

        return self._start(name, [f"--address={self.address}", f"--num-cpus={num_cpus}",
                                  f"--resources={json.dumps(resources)}"], env or {})

    def connect(self, timeout_s: float = 180) -> None:
        """ray.init this process as a driver of the cluster (GCS up)."""
        import ray

        self._set_auth_mode("disabled")
        deadline = time.monotonic() + timeout_s
        while True:
            self.check_alive()
            try:
                ray.init(address=self.address, logging_level="WARNING", log_to_driver=False)
                return
            except Exception:  # noqa: BLE001 - the GCS is not up yet
                if time.monotonic() > deadline:
                    raise
                time.sleep(2)

    def disconnect(self) -> None:
        """ray.shutdown, and this process's auth mode back as it was (a later local ray.init
        in this process, e.g. the integration tests', must decide it afresh)."""
        import ray

        ray.shutdown()
        self._set_auth_mode(self._saved_auth_mode)

    def _set_auth_mode(self, mode: Optional[str]) -> None:
        from ray._raylet import Config

        if not hasattr(self, "_saved_auth_mode"):
            self._saved_auth_mode = os.environ.get("RAY_AUTH_MODE")
        if mode is None:
            os.environ.pop("RAY_AUTH_MODE", None)
        else:
            os.environ["RAY_AUTH_MODE"] = mode
        Config.initialize("")  # the driver's cached Ray config reads the mode again

    def check_alive(self) -> None:
        for node in self.nodes:
            code = node.proc.poll()
            if code is not None and node.node_id is None and (node.blocking or code != 0):
                raise RuntimeError(f"`ray start` of node {node.name} exited with {node.proc.returncode}:\n"
                                   f"{node.log.read_text()[-3000:]}")

    def wait_nodes(self, n: int, timeout_s: float = 180) -> None:
        """Until n nodes are alive; learn each node's Ray node id (by its custom resource)."""
        import ray

        deadline = time.monotonic() + timeout_s
        while True:
            self.check_alive()
            alive = [x for x in ray.nodes() if x["Alive"]]
            for node in self.nodes:
                for x in alive:
                    if x["Resources"].get(f"node_{node.name}"):
                        node.node_id = x["NodeID"]
            if len(alive) >= n and all(node.node_id for node in self.nodes):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(alive)} of {n} Ray nodes alive after {timeout_s} s")
            time.sleep(0.5)

    def kill(self, node: RayNode) -> None:
        """The node is lost: SIGKILL its raylet first (what the cluster notices), then whatever
        of its processes is left (its workers die with their raylet; the rest as with the machine)."""
        for pid in node.raylet_pids():
            os.kill(pid, signal.SIGKILL)
        time.sleep(1)
        kill_marked(NODE_MARK, node.mark)

    def kill_gcs(self) -> StoppedGcs:
        """SIGKILL the head's GCS server; what restart_gcs needs to start it again."""
        [head] = [n for n in self.nodes if n.name == "head"]
        out = subprocess.run(["pgrep", "-f", "gcs_server"], capture_output=True, text=True).stdout
        [pid] = [int(p) for p in out.split() if has_mark(int(p), NODE_MARK, head.mark)]
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]
        env = dict(kv.split("=", 1) for kv in Path(f"/proc/{pid}/environ").read_bytes().decode().split("\0") if "=" in kv)
        cwd = os.readlink(f"/proc/{pid}/cwd")
        os.kill(pid, signal.SIGKILL)
        return StoppedGcs(cmd, env, cwd)

    def restart_gcs(self, stopped: StoppedGcs) -> None:
        """Start the GCS server again as it was; it reloads the cluster's tables from Redis."""
        [head] = [n for n in self.nodes if n.name == "head"]
        subprocess.Popen(stopped.cmd, env=stopped.env, cwd=stopped.cwd, start_new_session=True,
                         stdout=open(head.dir / "gcs_restarted.log", "w"), stderr=subprocess.STDOUT)

    def shutdown(self) -> None:
        for node in reversed(self.nodes):
            if node.proc.poll() is None:
                try:
                    os.killpg(node.proc.pid, signal.SIGTERM)
                except OSError:
                    pass
        # A few seconds to exit, then SIGKILL: nothing of a test cluster needs a graceful end (CI
        # time: `ray start --block` sat out all of a 20 s wait).
        deadline = time.monotonic() + 5
        while any(n.proc.poll() is None for n in self.nodes) and time.monotonic() < deadline:
            time.sleep(0.5)
        for node in self.nodes:
            kill_marked(NODE_MARK, node.mark)
            if node.proc.poll() is None:
                node.proc.kill()
            node.proc.wait()
        # Keep Serve's logs (controller, replicas) next to the test's files; drop the rest.
        logs = self.temp_dir / "session_latest" / "logs" / "serve"
        if logs.is_dir():
            shutil.copytree(logs, self.base / "serve-logs", dirs_exist_ok=True, ignore_dangling_symlinks=True)
        shutil.rmtree(self.temp_dir, ignore_errors=True)
