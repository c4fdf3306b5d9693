"""A process and its descendants, read from /proc and pgrep: what the fault tests kill and then
check is gone."""

import subprocess
from pathlib import Path


def alive(pid: int) -> bool:
    """Running, not a zombie waiting for its (dead) parent to reap it."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def descendants(pid: int) -> list[int]:
    """Its children, their children, and so on."""
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    children = [int(p) for p in out.split()]
    return children + [d for c in children for d in descendants(c)]
