"""How an Engine replica runs vLLM's CPU backend: the environment vLLM reads when it starts, and
the dtype `auto` means on this CPU.

Each is a default: a variable the operator set (in the replica's runtime_env, or the environment
`serve run` starts in) is left alone, and nothing is set on GPUs.

- OMP_NUM_THREADS = the replica's share of the cores its pool may use (engine_deployment.cpu_affinity,
  else the node's cpuset): those cores divided by the Engine replicas that may run on them at once
  (engines_on_node). Ray sets it to the replica's num_cpus (1 in the CPU profile) and EngineCore
  inherits it, so a lone replica computed on one thread of two; a share of all cores for each of
  several replicas would spin more OpenMP threads than cores. The front door (Ingress, proxy, Ray) is not
  given cores of its own here: it time-slices with the Engine's threads (on 2 cores, with the
  Ingress carrying the requests, two threads gave 1.10-1.30x bare vLLM's output tok/s where one
  gave 0.73-0.85x: docs/operations.md, "Threads and dtype").
  An operator's OMP_NUM_THREADS counts only if it was in the process's environment when it
  started (runtime_env env_vars, or the shell of `serve run`): Ray's own is set inside the worker.
- VLLM_CPU_OMP_THREADS_BIND=nobind: vLLM's "auto" binds the model's threads to the same cores in
  every engine of a node (all but the last), so two Engine replicas on one node time-slice one
  core while the other idles (measured on 2 cores: 1.9x the throughput with nobind,
  docs/benchmarks.md, "Overload").
- VLLM_ENABLE_V1_MULTIPROCESSING=0: vLLM's CPU platform then keeps the model's worker inside the
  EngineCore process (the "uni" executor) instead of a process of its own. AsyncLLM still runs
  EngineCore as its own process (it always does); what goes is the hop between EngineCore and
  the worker, where EngineCore spins for up to a second on shared memory waiting for each step
  (0.5-0.75 of a core measured under load here, next to a worker that got 0.65-0.8 of its core).
  On 2 cores, one tenant at a dispatch limit of 8: 62.0 -> 74.3 output tok/s (16 in flight),
  51.2 -> 68.7 (48 in flight) (docs/benchmarks.md, "The worker inside EngineCore"). vLLM's CPU
  platform forces the worker process only to set OpenMP's binding for it, which nobind skips.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

CPU_BACKEND_ENV = {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
THREADS_VAR = "OMP_NUM_THREADS"
# /proc/cpuinfo flags of a CPU that computes bfloat16 natively (AVX512-BF16, or AMX's bf16 tiles).
# Without them vLLM-CPU and torch emulate bf16 over float32 and run it slower than float32.
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")

_pool_cpus: set[int] | None = None  # what pin_to_cpus pinned this process to (its pool's cpu_affinity)
_sharing: int = 1  # Engine replicas that may run on those cores at once (share_cores)


def set_cpu_backend_env(environ=os.environ, is_cpu: bool | None = None, threads: int | None = None,
                        initial_environ: dict[str, str] | None = None) -> dict[str, str]:
    """On vLLM's CPU backend, set CPU_BACKEND_ENV's variables the operator has not set, and
    OMP_NUM_THREADS to `threads` (default: engine_threads()) unless the operator set it (it is in
    `initial_environ`, default: this process's environment at exec); returns those it set. Call
    it before vLLM builds its config (the executor is chosen then) and spawns EngineCore (which
    inherits the environment)."""
    if is_cpu is None:
        from vllm.platforms import current_platform

        is_cpu = current_platform.is_cpu()
    if not is_cpu:
        return {}
    added = {k: v for k, v in CPU_BACKEND_ENV.items() if k not in environ}
    initial = exec_environ() if initial_environ is None else initial_environ
    if THREADS_VAR not in initial:
        added[THREADS_VAR] = str(threads or engine_threads())
    environ.update(added)
    return added


def exec_environ() -> dict[str, str]:
    """This process's environment as it was started (/proc/self/environ): what the operator and
    runtime_env gave it, without what Ray set inside the worker (OMP_NUM_THREADS from num_cpus)."""
    try:
        raw = open("/proc/self/environ", "rb").read()
    except OSError:
        return dict(os.environ)
    return dict(item.decode(errors="replace").partition("=")[::2] for item in raw.split(b"\0") if b"=" in item)


def engine_threads() -> int:
    """vLLM's compute threads: the CPUs the Engine's pool may use (pin_to_cpus's, else the node's),
    divided by the replicas sharing them (share_cores), at least one."""
    return max(1, len(_pool_cpus or node_cpus()) // _sharing)


@dataclass(frozen=True)
class EngineDeployment:
    """One Engine deployment of the app as Serve runs it: what bounds its replicas on one node."""

    max_replicas: int  # num_replicas, or autoscaling's max_replicas
    num_cpus: float  # Ray's logical CPUs per replica
    max_replicas_per_node: int | None = None
    pinned: bool = False  # its pool has cpu_affinity: its replicas run on their own cores


def engines_on_node(deployments: list[EngineDeployment], node_cpus: float) -> int:
    """At most how many Engine replicas of these deployments run on one node with `node_cpus`
    logical CPUs at once: each deployment's replicas, bounded by max_replicas_per_node and by how
    many of its num_cpus fit on the node. An upper bound (replicas of several deployments may not
    all fit together): a share too small costs speed, one too large oversubscribes the cores."""
    total = 0
    for d in deployments:
        n = d.max_replicas
        if d.max_replicas_per_node:
            n = min(n, d.max_replicas_per_node)
        if d.num_cpus > 0:
            n = min(n, int(node_cpus / d.num_cpus + 1e-9))
        total += max(n, 0)
    return max(1, total)


def share_cores(mine: EngineDeployment, others: list[EngineDeployment], node_cpus: float) -> int:
    """Set how many Engine replicas share this replica's cores (engine_threads divides by it) and
    return it: a pinned pool's replicas share its own cores; unpinned ones share the node's with
    every other unpinned Engine deployment of the app (pinned pools keep to their cores)."""
    global _sharing
    group = [mine] + ([] if mine.pinned else [d for d in others if not d.pinned])
    _sharing = engines_on_node(group, node_cpus)
    return _sharing


def cpu_flags(cpuinfo: str) -> set[str]:
    """The feature flags of /proc/cpuinfo's first processor."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return set(value.split())
    return set()


def auto_dtype(cpuinfo: str) -> tuple[str, str]:
    """What `dtype: auto` runs on a CPU with this /proc/cpuinfo, and why: bfloat16 where the CPU
    computes it natively, float32 elsewhere (vLLM's own auto would take the model's bfloat16)."""
    native = sorted(cpu_flags(cpuinfo) & set(NATIVE_BF16_FLAGS))
    if native:
        return "bfloat16", f"the CPU has native bf16 ({', '.join(native)})"
    return "float32", f"the CPU has no native bf16 (none of {', '.join(NATIVE_BF16_FLAGS)} in /proc/cpuinfo)"


def resolve_cpu_dtype(dtype: str, cpuinfo_path: str = "/proc/cpuinfo") -> tuple[str, str | None]:
    """(dtype to run, why) for an engine's `dtype` on the CPU backend: `auto` as auto_dtype says,
    any other value as it is (reason None)."""
    if dtype != "auto":
        return dtype, None
    try:
        text = open(cpuinfo_path).read()
    except OSError:
        text = ""
    return auto_dtype(text)


def node_cpus() -> set[int]:
    """The CPUs this node lets processes use: its cgroup's cpuset, else every CPU. Not this
    process's own affinity, which `taskset -c ... serve run` narrows for the front door."""
    for path in ("/sys/fs/cgroup/cpuset.cpus.effective", "/sys/fs/cgroup/cpuset/cpuset.effective_cpus"):
        try:
            text = open(path).read().strip()
        except OSError:
            continue
        if text:
            return {cpu for part in text.split(",")
                    for cpu in range(int(part.split("-")[0]), int(part.split("-")[-1]) + 1)}
    return set(range(os.cpu_count() or 1))


def pin_to_cpus(cpus: list[int] | None) -> set[int] | None:
    """Run every thread of this process, and the vLLM processes it starts afterwards (they
    inherit it), on `cpus` (EngineDeploymentConfig.cpu_affinity); None: left as it is. Returns the
    set it pinned to. Every thread, not only the caller: sched_setaffinity(0) sets one thread's
    mask, and a Serve replica's request loop and Ray's own threads would float over the other
    pools' cores."""
    global _pool_cpus
    if not cpus:
        return None
    missing = sorted(set(cpus) - node_cpus())
    if missing:
        raise ValueError(f"engine_deployment.cpu_affinity names CPUs {missing} this node does not offer "
                         f"(it has {sorted(node_cpus())}): fix the pool's cpu_affinity")
    for _ in range(2):  # twice: a thread started while the first pass ran inherited the old mask
        for task in os.listdir("/proc/self/task"):
            try:
                os.sched_setaffinity(int(task), set(cpus))
            except (ProcessLookupError, FileNotFoundError):
                pass  # the thread ended meanwhile
    _pool_cpus = set(cpus)
    return set(cpus)


def renice_children(steps: int, skip: set[int] = frozenset(), pid: int | None = None) -> list[int]:
    """Lower every thread of this process's descendants but `skip` (vLLM's EngineCore: its OpenMP
    threads exist once it has loaded the model; threads started later inherit it) by `steps` of
    niceness, to at most 19, and return their pids. Relative, because Ray already runs every
    worker (the replicas, Serve's proxy) at its worker_niceness, 15. Linux keeps niceness per
    thread, so each task of each process gets it."""
    import psutil

    done = []
    for child in psutil.Process(pid).children(recursive=True):
        if child.pid in skip:
            continue
        try:
            for task in os.listdir(f"/proc/{child.pid}/task"):
                tid = int(task)
                os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + steps))
        except (OSError, psutil.Error):  # it exited meanwhile
            continue
        done.append(child.pid)
    return done
