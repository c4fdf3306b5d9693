"""Serve's autoscaling of the Engine pool on the real `serve run`: up under a load ramp, down after
it, no request failed, tenants kept on their replicas.

    python -m bench autoscaling [--tenants 8] [--clients 4] [--max-tokens 48] [--port 8400]

One `serve run` of the shipped serve_config.yaml with fresh state, the Engine deployment under
Serve's `autoscaling_config` in its `deployments:` entry (1..2 replicas, target 1 ongoing request,
short delays; 0.5 CPU each, so two fit beside the Ingress on 2 cores). Every change below is to the
autoscaling_config's values through `serve deploy`, which Serve applies in place (no replica
restarts). Steps: idle at one replica; closed-loop clients over --tenants tenants, one more every
2 s up to --clients, until Serve adds a replica; the load then pauses while the added engine loads
(on 2 shared cores a busy engine starves a starting one) with downscale_delay_s held high
meanwhile; 3 clients until 24 requests were served by the two; then a trickle while
downscale_delay_s is back to seconds and Serve removes a replica, draining it. Which replica served
each request is read from the usage ledger. The table: each step's seconds and requests, failed
requests, and how many tenants kept the replica that served most of their requests.
"""

from __future__ import annotations

import collections
import secrets
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import yaml

from bench.processes import BIN, ROOT, port_in_use
from bench.report import Table
from bench.serve_run import ServeRun, serve_cli_env
from bench.state import with_fresh_state
from bench.tenants import new_tenant_key

APP, MODEL = "loraplex", "SmolLM2-135M-Instruct"
# Short delays so each step shows within seconds; downscale_delay_s is raised while an added
# replica loads (see the module's docstring).
AUTOSCALING = {"min_replicas": 1, "max_replicas": 2, "target_ongoing_requests": 1,
               "upscale_delay_s": 2, "downscale_delay_s": 8, "look_back_period_s": 3}
HELD_S = 600  # downscale_delay_s while the added replica loads


def add_arguments(p) -> None:
    p.add_argument("--tenants", type=int, default=8, help="tenants the closed-loop clients cycle through")
    p.add_argument("--clients", type=int, default=4, help="the ramp's most clients at once")
    p.add_argument("--max-tokens", type=int, default=48, help="tokens per request of the load (8 for the trickle)")
    p.add_argument("--served-with-two", type=int, default=24, help="requests served once both replicas run")
    p.add_argument("--port", type=int, default=8400)


def write_config(state: Path, port: int, autoscaling: dict) -> tuple[dict, Path]:
    doc = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    doc["http_options"]["port"] = port
    app = doc["applications"][0]
    args = with_fresh_state(app["args"], state, flush_interval_s=0.2)
    args["engine"]["model"] = str(ROOT / args["engine"]["model"])
    args["engine_deployment"]["num_cpus"] = 0.5
    args["ingress"]["num_cpus"] = 0.5
    engine = next((d for d in app.setdefault("deployments", []) if d["name"] == "Engine"), None)
    if engine is None:
        engine = {"name": "Engine"}
        app["deployments"].append(engine)
    engine.pop("num_replicas", None)
    engine["autoscaling_config"] = autoscaling
    path = state / "serve_config.yaml"
    path.write_text(yaml.safe_dump(doc))
    return doc, path


def deploy(doc: dict, path: Path, autoscaling: dict) -> None:
    """`serve deploy` of the config with these autoscaling values, as an operator changes them."""
    next(d for d in doc["applications"][0]["deployments"] if d["name"] == "Engine")["autoscaling_config"] = autoscaling
    path.write_text(yaml.safe_dump(doc))
    done = subprocess.run([str(BIN / "serve"), "deploy", str(path)], capture_output=True, text=True,
                          env=serve_cli_env())
    if done.returncode != 0:
        raise SystemExit(f"serve deploy failed: {done.stderr[-2000:]}")


def engine_states() -> dict[str, int]:
    """The Engine deployment's replicas by state, as `serve status` reports them."""
    done = subprocess.run([str(BIN / "serve"), "status"], capture_output=True, text=True, env=serve_cli_env())
    try:
        app = yaml.safe_load(done.stdout)["applications"][APP]
        return dict(app["deployments"]["Engine"].get("replica_states") or {})
    except (yaml.YAMLError, KeyError, TypeError):
        return {}


def wait_for_running(n: int, timeout_s: float, what: str) -> float:
    """Seconds until exactly n Engine replicas, all running."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        states = engine_states()
        if states.get("RUNNING") == n and sum(states.values()) == n:
            return time.monotonic() - started
        time.sleep(1)
    raise SystemExit(f"autoscaling: {what}: not {n} running Engine replicas after {timeout_s:.0f} s: {engine_states()}")


class Load:
    """Closed-loop clients over a set of tenants, added one by one (a bounded ramp)."""

    def __init__(self, base_url: str, keys: dict[str, str], max_tokens: int):
        self.base_url, self.keys, self.max_tokens = base_url, keys, max_tokens
        self.results: list[tuple[str, int, str, float]] = []  # (tenant, status, request id, end time)
        self.clients: list[tuple[threading.Thread, threading.Event]] = []
        self.lock = threading.Lock()

    def add_client(self) -> None:
        halt = threading.Event()
        thread = threading.Thread(target=self._client, args=(len(self.clients), halt), daemon=True)
        self.clients.append((thread, halt))
        thread.start()

    def running(self) -> int:
        return sum(not halt.is_set() for _, halt in self.clients)

    def remove_clients(self, n: int) -> None:
        for _, halt in [c for c in self.clients if not c[1].is_set()][:n]:
            halt.set()

    def _client(self, i: int, halt: threading.Event) -> None:
        names = sorted(self.keys)
        with httpx.Client(base_url=self.base_url, timeout=180) as http:
            while not halt.is_set():
                tenant = names[i % len(names)]
                i += 1
                try:
                    reply = http.post("/v1/chat/completions", headers={"Authorization": f"Bearer {self.keys[tenant]}"},
                                      json={"model": MODEL, "max_tokens": self.max_tokens, "ignore_eos": True,
                                            "temperature": 0, "messages": [{"role": "user", "content": f"Hi, {tenant}."}]})
                    status, rid = reply.status_code, reply.headers.get("x-loraplex-request-id", "")
                except httpx.HTTPError as exc:
                    status, rid = 0, repr(exc)
                with self.lock:
                    self.results.append((tenant, status, rid, time.monotonic()))

    def served_after(self, t: float) -> int:
        with self.lock:
            return sum(1 for _, status, _, end in self.results if status == 200 and end > t)

    def finish(self) -> None:
        self.remove_clients(len(self.clients))
        for thread, _ in self.clients:
            thread.join(timeout=180)
            if thread.is_alive():
                raise SystemExit("autoscaling: a request hung")


def replica_ids(db: Path, request_ids: list[str], timeout_s: float = 60) -> dict[str, str]:
    """request id -> the replica that served it, once every one has its usage record."""
    deadline = time.monotonic() + timeout_s
    while True:
        with sqlite3.connect(db) as conn:
            found = dict(conn.execute(f"SELECT request_id, replica_id FROM usage_records WHERE request_id IN "
                                      f"({','.join('?' * len(request_ids))})", request_ids).fetchall())
        if len(found) == len(request_ids) or time.monotonic() > deadline:
            return found
        time.sleep(1)


def homes(db: Path, results, since: float = 0.0, until: float = float("inf")) -> dict[str, str]:
    """tenant -> the replica that served most of its requests that ended in [since, until)."""
    picked = [(t, rid) for t, status, rid, end in results if status == 200 and since <= end < until]
    served = replica_ids(db, [rid for _, rid in picked])
    counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for tenant, rid in picked:
        if rid in served:
            counts[tenant][served[rid]] += 1
    return {t: c.most_common(1)[0][0] for t, c in counts.items()}


def kept(before: dict[str, str], after: dict[str, str]) -> str:
    common = set(before) & set(after)
    return f"{sum(before[t] == after[t] for t in common)}/{len(common)}"


def failed(results) -> int:
    return sum(1 for r in results if r[1] != 200)


def run(args, out) -> int:
    if port_in_use(args.port):
        raise SystemExit(f"port {args.port} is taken; pick another with --port")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # SIGTERM as Ctrl-C: the run below is stopped
    admin_token = secrets.token_urlsafe(16)
    table = Table("Autoscaling 1 -> 2 -> 1 Engine replicas under a load ramp", [
        ("step", "step"), ("replicas", "replicas"), ("seconds", "seconds", "{:.0f}"),
        ("requests", "requests served", "{}"), ("failed", "failed", "{}"), ("kept", "tenants kept their replica")])
    with tempfile.TemporaryDirectory(prefix="bench-autoscaling-") as tmp_dir:
        state = Path(tmp_dir)
        doc, path = write_config(state, args.port, dict(AUTOSCALING))
        with ServeRun(path, port=args.port, log_path=state / "serve_run.log", admin_token=admin_token) as serve:
            t0 = time.monotonic()
            serve.wait_ready()
            table.add(step="serve run ready", replicas=1, seconds=time.monotonic() - t0)
            db = state / "loraplex.db"
            keys = {f"scale-{i}": new_tenant_key(serve.base_url, admin_token, f"scale-{i}") for i in range(args.tenants)}

            deploy(doc, path, {**AUTOSCALING, "downscale_delay_s": HELD_S})
            load = Load(serve.base_url, keys, args.max_tokens)
            load.add_client()  # until every tenant was served once, on the one replica
            while len({t for t, s, _, _ in load.results if s == 200}) < len(keys):
                if time.monotonic() - t0 > 900:
                    raise SystemExit("autoscaling: the tenants were not all served on one replica")
                time.sleep(1)
            ramp = time.monotonic()
            while sum(engine_states().values()) < 2:
                if load.running() < args.clients:
                    load.add_client()
                if time.monotonic() - ramp > 180:
                    raise SystemExit("autoscaling: Serve did not add a replica under the load ramp")
                time.sleep(2)
            decided = time.monotonic()
            table.add(step="ramp until Serve adds a replica", replicas=1, seconds=decided - ramp,
                      requests=load.served_after(ramp), failed=failed(load.results), clients=load.running())
            load.remove_clients(load.running())
            wait_for_running(2, 600, "the added replica")
            joined = time.monotonic()
            table.add(step="the added replica runs (load paused)", replicas=2, seconds=joined - decided)
            for _ in range(3):
                load.add_client()
            while load.served_after(joined) < args.served_with_two:
                if time.monotonic() - joined > 300:
                    raise SystemExit("autoscaling: too few requests served with two replicas")
                time.sleep(1)
            load.finish()
            stopped = time.monotonic()
            before_up = homes(db, load.results, until=decided)
            with_two = homes(db, load.results, since=joined)
            spread = {r for r in replica_ids(db, [rid for _, s, rid, end in load.results
                                                   if s == 200 and end > joined]).values()}
            table.add(step=f"{args.served_with_two} requests on both", replicas=len(spread), seconds=stopped - joined,
                      requests=load.served_after(joined), failed=failed(load.results), kept=kept(before_up, with_two))

            trickle = Load(serve.base_url, keys, 8)
            trickle.add_client()
            deploy(doc, path, dict(AUTOSCALING))
            wait_for_running(1, 300, "Serve to remove a replica after the load stopped")
            removed = time.monotonic()
            while trickle.served_after(removed) < len(keys):
                if time.monotonic() - removed > 180:
                    raise SystemExit("autoscaling: the trickle was not served by the replica left")
                time.sleep(1)
            trickle.finish()
            after_down = homes(db, trickle.results, since=removed)
            could = sum(with_two.get(t) in set(after_down.values()) for t in after_down)  # their replica stayed
            table.add(step="load stopped: Serve removes one (a trickle runs)", replicas=1, seconds=removed - stopped,
                      requests=len([r for r in trickle.results if r[1] == 200]), failed=failed(trickle.results),
                      kept=f"{kept(with_two, after_down)} ({could} could)")
    out.table(table)
    all_failed = failed(load.results) + failed(trickle.results)
    out.note(f"{len(load.results) + len(trickle.results)} requests, {all_failed} failed; 'kept' counts the tenants "
             "served before and after a change whose busiest replica stayed the same.")
    return 1 if all_failed else 0
