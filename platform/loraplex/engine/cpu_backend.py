"""How an Engine replica runs vLLM's CPU backend: the environment vLLM reads when it starts.

Both are defaults: a variable the operator set (in the replica's runtime_env, or the environment
`serve run` starts in) is left alone, and nothing is set on GPUs.

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

CPU_BACKEND_ENV = {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


def set_cpu_backend_env(environ=os.environ, is_cpu: bool | None = None) -> dict[str, str]:
    """On vLLM's CPU backend, set CPU_BACKEND_ENV's variables the operator has not set; returns
    those it set. Call it before vLLM builds its config (the executor is chosen then) and spawns
    EngineCore (which inherits the environment)."""
    if is_cpu is None:
        from vllm.platforms import current_platform

        is_cpu = current_platform.is_cpu()
    if not is_cpu:
        return {}
    added = {k: v for k, v in CPU_BACKEND_ENV.items() if k not in environ}
    environ.update(added)
    return added


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
    return set(cpus)
