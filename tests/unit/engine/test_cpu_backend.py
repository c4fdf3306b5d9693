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
