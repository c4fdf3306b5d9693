"""Processes a benchmark or test starts, marked so that stopping them stops those and nothing else.

Every process started here runs in its own session with NAME=VALUE in its environment, which
every child inherits (serve run's Ray cluster, its replicas, vLLM's workers). Stopping signals the
group, then SIGKILLs whatever still carries the mark: never `ray stop --force` or a kill by name,
which would stop other people's clusters on the machine.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def port_in_use(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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


def checkout_env(extra: Optional[dict] = None) -> dict:
    """This process's environment for a fresh local cluster (no RAY_ADDRESS), with this
    checkout's package and bench/ first on PYTHONPATH, also in the Ray workers it starts
    (wherever another checkout's loraplex is installed in the venv)."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    ours = [str(ROOT / "platform"), str(ROOT)]
    env["PYTHONPATH"] = os.pathsep.join(ours + [p for p in env.get("PYTHONPATH", "").split(os.pathsep)
                                                if p and p not in ours])
    env.update(extra or {})
    return env


def start_marked(argv: Sequence[str], *, mark: tuple[str, str], log_path: Path, cwd: Path = ROOT,
                 env: Optional[dict] = None, log_header: str = "",
                 cpus: Optional[set[int]] = None) -> subprocess.Popen:
    """argv in its own session, output to log_path, NAME=VALUE (`mark`) in its environment, on
    `cpus` if given (as `taskset -c`: every process it starts inherits them unless it pins itself).
    A process started from a background job inherits SIGINT ignored (CI runners, `cmd &`), and
    `serve run` stops on SIGINT only: it gets the default back."""
    env = checkout_env({**(env or {}), mark[0]: mark[1]})
    log = open(log_path, "w")

    def in_child():
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        if cpus:
            os.sched_setaffinity(0, cpus)
    if log_header:
        log.write(log_header + "\n")
        log.flush()
    try:
        proc = subprocess.Popen(list(argv), cwd=cwd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True,
                                preexec_fn=in_child)
    finally:
        log.close()  # the child has its own descriptor
    proc.run_mark = mark[1]
    return proc


def stop_marked(proc: subprocess.Popen, mark: tuple[str, str], *, grace_s: float = 90,
                first: signal.Signals = signal.SIGINT, term_s: float = 15, port: Optional[int] = None,
                gone_s: float = 60) -> None:
    """`first` to the group (SIGINT: as an operator stops serve run), SIGTERM then SIGKILL if it
    outlives `grace_s`; then SIGKILL whatever still carries the mark, and wait until those are
    gone and `port` is free (the next run binds it)."""
    if proc.poll() is None:
        for sig, wait_s in ((first, grace_s), (signal.SIGTERM, term_s), (signal.SIGKILL, None)):
            try:
                os.killpg(proc.pid, sig)
            except OSError:
                pass
            try:
                proc.wait(timeout=wait_s)
                break
            except subprocess.TimeoutExpired:
                continue
    kill_marked(*mark)
    deadline = time.monotonic() + gone_s
    while (marked(*mark) or (port is not None and port_in_use(port))) and time.monotonic() < deadline:
        time.sleep(0.5)
