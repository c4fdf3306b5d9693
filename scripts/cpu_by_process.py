#!/usr/bin/env python
"""CPU cores each kind of process uses over a window: where a run's CPU goes.

    python scripts/cpu_by_process.py SECONDS [OUT]

Samples every process's CPU time (psutil) every 2 s for SECONDS and prints, per kind (the Serve
replica or vLLM process it is, else its name), the cores it used on average. Run it next to a
load test level (docs/benchmarks.md, "Load test and capacity").
"""

import collections
import sys
import time

import psutil

KINDS = ("ServeReplica:loraplex:Engine", "ServeReplica:loraplex:Ingress", "ProxyActor", "ServeController",
         "VLLM::EngineCore", "VLLM::Worker", "vllm.entrypoints.openai.api_server", "bench loadtest",
         "raylet", "gcs_server", "dashboard", "serve run", "pytest")


def kind(p: psutil.Process) -> str:
    try:
        cmd = " ".join(p.cmdline())
        return next((k for k in KINDS if k in cmd), p.name()[:40])
    except psutil.Error:
        return "?"


def main() -> None:
    seconds = float(sys.argv[1])
    first: dict[tuple, tuple[float, str]] = {}
    last: dict[tuple, float] = {}
    start = time.time()
    while time.time() - start < seconds:
        for p in psutil.process_iter():
            try:
                t = p.cpu_times()
                key = (p.pid, p.create_time())
            except psutil.Error:
                continue
            first.setdefault(key, (t.user + t.system, kind(p)))
            last[key] = t.user + t.system
        time.sleep(2)
    elapsed = time.time() - start
    cores = collections.Counter()
    for key, total in last.items():
        cores[first[key][1]] += (total - first[key][0]) / elapsed
    lines = [f"{elapsed:.0f} s"] + [f"{k:45s} {c:.2f} cores" for k, c in cores.most_common(15)]
    text = "\n".join(lines) + "\n"
    if len(sys.argv) > 2:
        open(sys.argv[2], "w").write(text)
    print(text, end="")


if __name__ == "__main__":
    main()
