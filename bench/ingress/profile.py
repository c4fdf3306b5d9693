"""Where a replica's time goes while a benchmark loads it: py-spy (a sampling profiler, in the
test extra) attached to Serve replica processes, summarised as the share of samples per function.

Ray names a replica's process `ray::ServeReplica:<app>:<deployment>`; py-spy reads its stacks from
outside, so nothing in the replica changes while it is measured."""

from __future__ import annotations

import subprocess
from collections import Counter
from pathlib import Path

import psutil


def replica_pids(app: str, deployment: str) -> list[int]:
    title = f"ServeReplica:{app}:{deployment}"
    return [p.pid for p in psutil.process_iter(["cmdline"]) if any(title in part for part in p.info["cmdline"] or [])]


KINDS = ("ServeReplica:benchstream:Ingress", "ServeReplica:benchstream:Engine", "ServeReplica:benchstream:BareIngress",
         "ServeReplica:benchstream:BareTokens", "ProxyActor", "ServeController", "raylet", "gcs_server",
         "bench ingress")  # this benchmark: python -m bench ingress, or scripts/bench ingress


def cpu_seconds_by_kind() -> Counter:
    """CPU seconds (user + system) every process has used so far, summed per kind: the Serve
    replica or actor it is, this benchmark (its client), else "other". Two snapshots' difference
    over the requests between them is what each process spent per request."""
    seconds = Counter()
    for p in psutil.process_iter(["cmdline", "cpu_times"]):
        times, cmd = p.info["cpu_times"], " ".join(p.info["cmdline"] or [])
        if times is not None:
            seconds[next((k for k in KINDS if k in cmd), "other")] += times.user + times.system
    return seconds


def start_recording(pid: int, seconds: float, out: Path) -> subprocess.Popen:
    """py-spy record in collapsed-stack form ("frame;frame;frame count" per line), idle frames left out."""
    return subprocess.Popen(["py-spy", "record", "--pid", str(pid), "--duration", str(int(seconds)),
                             "--format", "raw", "--rate", "200", "--output", str(out), "--nonblocking"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def summarise(collapsed: Path, top: int = 25) -> list[tuple[str, float, float]]:
    """(function, self share, inclusive share) of the samples, largest inclusive first."""
    own, inclusive, total = Counter(), Counter(), 0
    for line in collapsed.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        n = int(count)
        total += n
        frames = [f.split(" (")[0] + " (" + f.split(" (")[1].split(":")[0].rsplit("/", 1)[-1] + ")"
                  if " (" in f else f for f in stack.split(";")]
        own[frames[-1]] += n
        for frame in set(frames):
            inclusive[frame] += n
    if not total:
        return []
    return [(f, own[f] / total, n / total) for f, n in inclusive.most_common(top)]
