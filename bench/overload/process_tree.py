"""RSS and CPU of a serve run's process tree, by kind of process, sampled while a phase runs."""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from pathlib import Path

import psutil

# (what the command line contains, the kind of process), first match wins; Ray workers' titles
# are `ray::<actor or task>` and change while they run a method (`...Engine.handle_request`).
KINDS = (
    ("ServeReplica:", None), ("ServeController", "Serve controller"), ("ProxyActor", "Serve proxy"),
    ("LimiterActor", "limiter actor (Ray)"), ("EngineCore", "vLLM EngineCore"),
    ("VLLM::Worker", "vLLM CPU worker (model, KV cache)"), ("orphan_guard", "orphan guard (Engine)"),
    ("resource_tracker", "multiprocessing resource tracker"), ("dashboard/agent.py", "Ray dashboard agent"),
    ("DashboardAgent", "Ray dashboard agent"), ("runtime_env/agent", "Ray runtime-env agent"),
    ("RuntimeEnvAgent", "Ray runtime-env agent"), ("ray-dashboard-", "Ray dashboard modules"),
    ("dashboard.py", "Ray dashboard"), ("log_monitor", "Ray log monitor"), ("monitor.py", "Ray monitor"),
    ("ray::IDLE", "idle Ray worker"), ("multiprocessing.forkserver", "Ray dashboard modules"),
)


def process_kind(p: psutil.Process, root_pid: int) -> str:
    if p.pid == root_pid:
        return "serve run (driver)"
    try:
        name = p.name()
        if name in ("raylet", "gcs_server"):
            return name
        cmd = f"{' '.join(p.cmdline())} {name}"
    except psutil.Error:
        return "?"
    for needle, kind in KINDS:
        if needle in cmd:
            if kind is None:  # ray::ServeReplica:<app>:<deployment>[.<method>]
                deployment = cmd.split("ServeReplica:")[1].split()[0].split(":")[-1].split(".")[0]
                return f"{deployment} replica (Serve)"
            return kind
    try:  # another program: its script's or binary's name
        argv = p.cmdline()
        script = next((a for a in argv[1:] if not a.startswith("-")), "") if "python" in argv[0] else argv[0]
        return Path(script).name or name
    except (psutil.Error, IndexError):
        return name


def busy_cpu_seconds() -> float:
    t = psutil.cpu_times()
    return sum(t) - t.idle - getattr(t, "iowait", 0.0)


class ProcessSampler(threading.Thread):
    """RSS and CPU time of every process in the serve run's tree, every period_s, while running;
    and the machine's busy CPU time over the same span (to tell what else was running)."""

    def __init__(self, root_pid: int, period_s: float):
        super().__init__(daemon=True)
        self.root_pid, self.period_s = root_pid, period_s
        self.stop_event = threading.Event()
        self.kind: dict[int, str] = {}  # pid -> its kind when last seen
        self.peak_rss: dict[int, int] = {}
        self.cpu_first: dict[int, float] = {}
        self.cpu_last: dict[int, float] = {}
        self.peak_kind_total: dict[str, int] = defaultdict(int)
        self.peak_total = 0
        self.samples = 0
        self.me = psutil.Process()

    def snapshot(self) -> list[tuple[str, psutil.Process, int, float]]:
        try:
            root = psutil.Process(self.root_pid)
            procs = [root] + root.children(recursive=True)
        except psutil.Error:
            return []
        out = []
        for p in procs:
            try:
                with p.oneshot():
                    cpu = p.cpu_times()
                    out.append((process_kind(p, self.root_pid), p, p.memory_info().rss, cpu.user + cpu.system))
            except psutil.Error:
                pass
        return out

    def run(self) -> None:
        self.started, self.busy0 = time.monotonic(), busy_cpu_seconds()
        me = self.me.cpu_times()
        self.me0 = me.user + me.system
        while True:
            snap = self.snapshot()
            totals: dict[str, int] = defaultdict(int)
            for kind, p, rss, cpu in snap:
                self.kind[p.pid] = kind
                self.peak_rss[p.pid] = max(self.peak_rss.get(p.pid, 0), rss)
                self.cpu_first.setdefault(p.pid, cpu)
                self.cpu_last[p.pid] = cpu
                totals[kind] += rss
            for kind, total in totals.items():
                self.peak_kind_total[kind] = max(self.peak_kind_total[kind], total)
            self.peak_total = max(self.peak_total, sum(totals.values()))
            self.samples += 1
            if self.stop_event.wait(self.period_s):
                break
        self.elapsed, self.busy = time.monotonic() - self.started, busy_cpu_seconds() - self.busy0
        me = self.me.cpu_times()
        self.me_cpu = me.user + me.system - self.me0

    def cpu_cores(self, pid: int) -> float:
        """Mean cores a process used over the sampled span."""
        return (self.cpu_last[pid] - self.cpu_first[pid]) / self.elapsed


ENGINE_KINDS = ("Engine replica (Serve)", "vLLM EngineCore", "vLLM CPU worker (model, KV cache)")


def engine_processes(sampler: ProcessSampler) -> set[tuple[str, int, float]]:
    """The Engine replicas' and their EngineCores' processes: (kind, pid, start time)."""
    out = set()
    for kind, p, _, _ in sampler.snapshot():
        if kind in ENGINE_KINDS:
            try:
                out.add((kind, p.pid, p.create_time()))
            except psutil.Error:
                pass
    return out


def mib(n: int) -> str:
    return f"{n / 2**20:,.0f}"
