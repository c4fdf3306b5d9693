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


def test_a_pool_pinned_to_cpus_runs_there_and_a_missing_cpu_stops_it():
    import multiprocessing as mp
    import os

    from loraplex.engine.cpu_backend import pin_to_cpus

    def child(q):  # in a child: pinning the test process would slow the rest of the suite
        first = min(os.sched_getaffinity(0))
        pinned = pin_to_cpus([first])
        q.put((pinned, os.sched_getaffinity(0)))
        try:
            pin_to_cpus([10_000])
        except ValueError as exc:
            q.put(str(exc))
    q = mp.get_context("fork").Queue()
    p = mp.get_context("fork").Process(target=child, args=(q,))
    p.start()
    pinned, now = q.get(timeout=30)
    assert now == pinned and len(pinned) == 1
    assert "cpu_affinity names CPUs [10000]" in q.get(timeout=30)
    p.join(30)
    assert pin_to_cpus(None) is None
