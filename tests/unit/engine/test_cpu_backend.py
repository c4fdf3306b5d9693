import pytest

from loraplex.engine import cpu_backend
from loraplex.engine.cpu_backend import (EngineDeployment, auto_dtype, engine_threads, engines_on_node, node_cpus,
                                         resolve_cpu_dtype, set_cpu_backend_env, share_cores)


def test_cpu_engines_get_unpinned_threads_on_every_core_of_the_pool_and_the_worker_inside_engine_core():
    env = {"OMP_NUM_THREADS": "1"}  # what Ray set inside the replica from num_cpus: 1
    assert set_cpu_backend_env(env, is_cpu=True, threads=2, initial_environ={}) == env
    assert env == {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
                   "OMP_NUM_THREADS": "2"}
    env = {}
    set_cpu_backend_env(env, is_cpu=True, initial_environ={})
    assert env["OMP_NUM_THREADS"] == str(len(node_cpus())) == str(engine_threads())


def test_replicas_that_may_share_a_node_split_its_cores_and_a_lone_one_takes_them_all(monkeypatch):
    """The shipped CPU profile (Engine num_cpus 1, Ingress 0.5 on 2 CPUs): one replica computes on
    both cores; two (test_production's layout, or autoscaling up to 2+) one each, never 4 threads."""
    monkeypatch.setattr(cpu_backend, "node_cpus", lambda: {0, 1})
    monkeypatch.setattr(cpu_backend, "_pool_cpus", None)
    one = EngineDeployment(max_replicas=1, num_cpus=1.0)
    assert share_cores(one, [], node_cpus=2.0) == 1 and engine_threads() == 2
    two = EngineDeployment(max_replicas=2, num_cpus=1.0)
    assert share_cores(two, [], node_cpus=2.0) == 2 and engine_threads() == 1
    # Autoscaling to 8: only 2 fit on the node's 2 logical CPUs.
    assert engines_on_node([EngineDeployment(max_replicas=8, num_cpus=1.0)], node_cpus=2.0) == 2
    assert engines_on_node([EngineDeployment(max_replicas=8, num_cpus=1.0, max_replicas_per_node=1)], 2.0) == 1
    # A dedicated version's replica (num_cpus 0.5) beside the pool's shares the node's cores too.
    dedicated = EngineDeployment(max_replicas=1, num_cpus=0.5)
    assert share_cores(one, [dedicated], node_cpus=2.0) == 2 and engine_threads() == 1
    # Never below one thread, however many may come.
    assert share_cores(EngineDeployment(max_replicas=16, num_cpus=0.1), [], node_cpus=2.0) == 16
    assert engine_threads() == 1


def test_a_pinned_pool_shares_only_its_own_cores(monkeypatch):
    monkeypatch.setattr(cpu_backend, "_pool_cpus", {2, 3})
    pinned = EngineDeployment(max_replicas=1, num_cpus=0.5, pinned=True)
    others = [EngineDeployment(max_replicas=1, num_cpus=0.5), EngineDeployment(max_replicas=1, num_cpus=0.5)]
    assert share_cores(pinned, others, node_cpus=4.0) == 1 and engine_threads() == 2
    unpinned = EngineDeployment(max_replicas=1, num_cpus=0.5)
    others = [EngineDeployment(max_replicas=1, num_cpus=0.5, pinned=True), EngineDeployment(max_replicas=2, num_cpus=0.5)]
    assert share_cores(unpinned, others, node_cpus=4.0) == 3


@pytest.fixture(autouse=True)
def _no_share_left_behind(monkeypatch):
    monkeypatch.setattr(cpu_backend, "_sharing", 1)


def test_an_operators_settings_and_gpus_are_left_alone():
    env = {"VLLM_CPU_OMP_THREADS_BIND": "0-15", "VLLM_ENABLE_V1_MULTIPROCESSING": "1", "OMP_NUM_THREADS": "3"}
    assert set_cpu_backend_env(env, is_cpu=True, threads=2, initial_environ={"OMP_NUM_THREADS": "3"}) == {}
    assert env == {"VLLM_CPU_OMP_THREADS_BIND": "0-15", "VLLM_ENABLE_V1_MULTIPROCESSING": "1", "OMP_NUM_THREADS": "3"}
    env = {"VLLM_CPU_OMP_THREADS_BIND": "0-15"}
    assert set_cpu_backend_env(env, is_cpu=True, threads=2, initial_environ={}) == {
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_NUM_THREADS": "2"}
    env = {}
    assert set_cpu_backend_env(env, is_cpu=False, threads=2, initial_environ={}) == {}
    assert env == {}


def test_the_operators_omp_num_threads_is_the_one_the_process_started_with_not_rays():
    """Ray sets OMP_NUM_THREADS inside the worker; runtime_env's and the shell's are there at exec."""
    import os
    import subprocess
    import sys

    import loraplex
    code = ("import os; os.environ['OMP_NUM_THREADS'] = '1'; from loraplex.engine.cpu_backend import exec_environ; "
            "print(exec_environ().get('OMP_NUM_THREADS'))")
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    env["PYTHONPATH"] = os.path.dirname(os.path.dirname(loraplex.__file__))  # this checkout's package
    assert subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          check=True).stdout.strip() == "None"
    assert subprocess.run([sys.executable, "-c", code], env={**env, "OMP_NUM_THREADS": "3"}, capture_output=True,
                          text=True, check=True).stdout.strip() == "3"
    check = "from loraplex.engine.cpu_backend import exec_environ; print('PATH' in exec_environ())"
    assert subprocess.run([sys.executable, "-c", check], env=env, capture_output=True, text=True,
                          check=True).stdout.strip() == "True"


CPUINFO = """processor\t: 0
vendor_id\t: {vendor}
model name\t: {model}
flags\t\t: fpu vme de pse tsc msr sse sse2 ssse3 sse4_1 sse4_2 avx avx2 fma {extra}
bugs\t\t: spectre_v1

processor\t: 1
flags\t\t: fpu avx avx2 {extra}
"""


def test_dtype_auto_is_bfloat16_on_a_cpu_with_native_bf16_and_float32_without():
    epyc = CPUINFO.format(vendor="AuthenticAMD", model="AMD EPYC", extra="")
    sapphire = CPUINFO.format(vendor="GenuineIntel", model="Xeon 8480", extra="avx512f avx512_bf16 amx_bf16 amx_tile")
    zen4 = CPUINFO.format(vendor="AuthenticAMD", model="AMD EPYC 9R14", extra="avx512f avx512_bf16")
    avx512_only = CPUINFO.format(vendor="GenuineIntel", model="Xeon 8275CL", extra="avx512f avx512bw avx512_vnni")
    assert auto_dtype(epyc)[0] == "float32" and "no native bf16" in auto_dtype(epyc)[1]
    assert auto_dtype(avx512_only)[0] == "float32"
    assert auto_dtype(sapphire) == ("bfloat16", "the CPU has native bf16 (amx_bf16, avx512_bf16)")
    assert auto_dtype(zen4) == ("bfloat16", "the CPU has native bf16 (avx512_bf16)")
    assert auto_dtype("")[0] == "float32"


def test_an_explicit_dtype_is_kept_and_auto_reads_the_cpu(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text(CPUINFO.format(vendor="x", model="x", extra="avx512_bf16"))
    assert resolve_cpu_dtype("float32", str(info)) == ("float32", None)
    assert resolve_cpu_dtype("bfloat16", str(tmp_path / "missing")) == ("bfloat16", None)
    assert resolve_cpu_dtype("auto", str(info))[0] == "bfloat16"
    assert resolve_cpu_dtype("auto", str(tmp_path / "missing"))[0] == "float32"


def test_a_pool_pinned_to_cpus_runs_there_every_thread_too_and_a_missing_cpu_stops_it():
    import multiprocessing as mp
    import os
    import threading

    from loraplex.engine.cpu_backend import node_cpus, pin_to_cpus

    def child(q):  # in a child: pinning the test process would slow the rest of the suite
        first = min(os.sched_getaffinity(0))
        started, stop = threading.Event(), threading.Event()
        seen = {}

        def other_thread():  # started before the pin, like a replica's request loop
            started.set()
            stop.wait()
            seen["other"] = os.sched_getaffinity(0)
        t = threading.Thread(target=other_thread)
        t.start()
        started.wait()
        pinned = pin_to_cpus([first])
        stop.set()
        t.join()
        q.put((pinned, os.sched_getaffinity(0), seen["other"], engine_threads()))
        try:
            pin_to_cpus([10_000])
        except ValueError as exc:
            q.put(str(exc))
    q = mp.get_context("fork").Queue()
    p = mp.get_context("fork").Process(target=child, args=(q,))
    p.start()
    pinned, now, other, threads = q.get(timeout=30)
    assert now == pinned and len(pinned) == 1
    assert threads == 1  # vLLM's threads: the pool's cores, not the node's
    assert other == pinned  # not only the calling thread
    assert "cpu_affinity names CPUs [10000]" in q.get(timeout=30)
    p.join(30)
    assert pin_to_cpus(None) is None
    assert node_cpus() >= os.sched_getaffinity(0)


def test_a_pool_may_take_cpus_outside_the_front_doors_affinity():
    """`taskset -c 0 serve run ...` keeps the front door on CPU 0; a pool on CPU 1 still starts."""
    import multiprocessing as mp
    import os

    from loraplex.engine.cpu_backend import pin_to_cpus

    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        import pytest
        pytest.skip("needs 2 CPUs")  # this machine and CI have 2

    def child(q):
        os.sched_setaffinity(0, {cpus[0]})
        q.put(pin_to_cpus([cpus[1]]) == os.sched_getaffinity(0) == {cpus[1]})
    q = mp.get_context("fork").Queue()
    p = mp.get_context("fork").Process(target=child, args=(q,))
    p.start()
    assert q.get(timeout=30) is True
    p.join(30)


def test_renice_children_lowers_every_thread_of_each_child_but_the_skipped():
    import os
    import subprocess
    import sys

    from loraplex.engine.cpu_backend import renice_children

    code = "import threading, time; threading.Thread(target=time.sleep, args=(30,)).start(); print(1, flush=True); time.sleep(30)"
    child, skipped = (subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE) for _ in range(2))
    try:
        child.stdout.readline(), skipped.stdout.readline()  # both threads started
        mine = os.getpriority(os.PRIO_PROCESS, 0)
        wanted = min(19, mine + 2)  # lowering priority needs no privilege
        reniced = renice_children(2, skip={skipped.pid})  # (and any other child this test process has)
        assert child.pid in reniced and skipped.pid not in reniced
        tasks = os.listdir(f"/proc/{child.pid}/task")
        assert len(tasks) == 2 and {os.getpriority(os.PRIO_PROCESS, int(t)) for t in tasks} == {wanted}
        assert {os.getpriority(os.PRIO_PROCESS, int(t)) for t in os.listdir(f"/proc/{skipped.pid}/task")} == {mine}
    finally:
        child.kill(), skipped.kill()
