from loraplex.engine.vllm_engine import unpin_cpu_workers


def test_cpu_engines_are_not_pinned_to_the_same_cores_by_default():
    env = {}
    assert unpin_cpu_workers(env, is_cpu=True)
    assert env == {"VLLM_CPU_OMP_THREADS_BIND": "nobind"}


def test_an_operators_binding_and_gpus_are_left_alone():
    env = {"VLLM_CPU_OMP_THREADS_BIND": "0-15"}
    assert not unpin_cpu_workers(env, is_cpu=True)
    assert env == {"VLLM_CPU_OMP_THREADS_BIND": "0-15"}
    env = {}
    assert not unpin_cpu_workers(env, is_cpu=False)
    assert env == {}
