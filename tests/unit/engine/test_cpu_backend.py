from loraplex.engine.cpu_backend import set_cpu_backend_env


def test_cpu_engines_get_unpinned_threads_and_the_worker_inside_engine_core_by_default():
    env = {}
    assert set_cpu_backend_env(env, is_cpu=True) == env
    assert env == {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


def test_an_operators_settings_and_gpus_are_left_alone():
    env = {"VLLM_CPU_OMP_THREADS_BIND": "0-15", "VLLM_ENABLE_V1_MULTIPROCESSING": "1"}
    assert set_cpu_backend_env(env, is_cpu=True) == {}
    assert env == {"VLLM_CPU_OMP_THREADS_BIND": "0-15", "VLLM_ENABLE_V1_MULTIPROCESSING": "1"}
    env = {"VLLM_CPU_OMP_THREADS_BIND": "0-15"}
    assert set_cpu_backend_env(env, is_cpu=True) == {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    env = {}
    assert set_cpu_backend_env(env, is_cpu=False) == {}
    assert env == {}


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
        q.put((pinned, os.sched_getaffinity(0), seen["other"]))
        try:
            pin_to_cpus([10_000])
        except ValueError as exc:
            q.put(str(exc))
    q = mp.get_context("fork").Queue()
    p = mp.get_context("fork").Process(target=child, args=(q,))
    p.start()
    pinned, now, other = q.get(timeout=30)
    assert now == pinned and len(pinned) == 1
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
