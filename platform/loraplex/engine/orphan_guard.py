"""Kill an Engine replica's child processes (vLLM's EngineCore) when the replica dies.

vLLM's EngineCore is a child process that does not watch its parent: when Ray SIGKILLs an
Engine replica (OOM, a failed health check, a node drain), EngineCore lives on, orphaned, with
the model and KV cache in memory (GPU memory on a GPU), and the replacement replica may not fit.
PR_SET_PDEATHSIG would have to be set by vLLM in the child, so instead a small guard process,
started by the replica in its own session, polls the replica: while it lives, the guard notes
its descendants; once it is gone, the guard SIGKILLs the last ones noted and exits.

Run as `python -m loraplex.engine.orphan_guard PARENT_PID [POLL_S]`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil


def start_guard(poll_s: float = 0.5) -> subprocess.Popen:
    """Start the guard for this process. Call it after the children exist or not: it re-reads
    them on every poll."""
    return subprocess.Popen(
        [sys.executable, "-m", "loraplex.engine.orphan_guard", str(os.getpid()), str(poll_s)],
        stdin=subprocess.DEVNULL, start_new_session=True,  # not in the replica's process group
    )


def guard(parent_pid: int, poll_s: float) -> int:
    me = os.getpid()
    try:
        parent = psutil.Process(parent_pid)
    except psutil.NoSuchProcess:
        return 0
    children: list[psutil.Process] = []
    while True:
        try:
            if not parent.is_running() or parent.status() == psutil.STATUS_ZOMBIE:
                break
            children = [c for c in parent.children(recursive=True) if c.pid != me]
        except psutil.NoSuchProcess:
            break
        time.sleep(poll_s)
    killed = 0
    for child in children:
        try:
            child.kill()  # psutil checks the pid still names the same process (no pid reuse)
            killed += 1
        except psutil.NoSuchProcess:
            pass
    if killed:
        print(f"orphan_guard: replica {parent_pid} is gone; killed {killed} orphaned child process(es)",
              file=sys.stderr)
    return killed


if __name__ == "__main__":
    guard(int(sys.argv[1]), float(sys.argv[2]) if len(sys.argv) > 2 else 0.5)
