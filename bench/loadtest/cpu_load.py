"""Other work on the engine's cores, on purpose: a few processes that keep `cores` CPU busy in
short slices, as Ray's and Serve's processes do next to the engine (many brief wake-ups).

`python -m bench loadtest --bare-with-load CORES` runs bare vLLM once more under it, to test whether the
platform's loss against bare vLLM on a small CPU node is that much CPU taken from the engine
(docs/benchmarks.md: the profile measured ~0.2 cores for Ray and Serve)."""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import random
import time
from typing import Iterator

import psutil

PROCESSES = 4
PERIOD_S = 0.02  # one busy slice per period and process, at a random phase


def _burn(duty: float, seed: int) -> None:
    rng = random.Random(seed)
    time.sleep(rng.random() * PERIOD_S)
    while True:
        start = time.perf_counter()
        while time.perf_counter() - start < duty * PERIOD_S:
            pass
        time.sleep(PERIOD_S * (1 - duty) * rng.uniform(0.5, 1.5))


@contextlib.contextmanager
def cpu_load(cores: float) -> Iterator[dict]:
    """Keep `cores` cores busy (over PROCESSES processes) until the block ends; the dict it
    yields (cores, pids) gets `cores_used`, the CPU the processes actually took over the block."""
    duty = cores / PROCESSES
    if not 0 < duty < 1:
        raise ValueError(f"cpu_load: {cores} cores over {PROCESSES} processes is not a duty cycle in (0, 1)")
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_burn, args=(duty, i), daemon=True) for i in range(PROCESSES)]
    for p in procs:
        p.start()
    info: dict = {"cores": cores, "pids": [p.pid for p in procs]}
    started = time.monotonic()
    try:
        yield info
    finally:
        cpu = sum(_cpu_seconds(p.pid) for p in procs)
        info["cores_used"] = round(cpu / max(time.monotonic() - started, 1e-9), 3)
        for p in procs:
            p.terminate()
            p.join(5)


def _cpu_seconds(pid: int) -> float:
    try:
        times = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return 0.0
    return times.user + times.system
