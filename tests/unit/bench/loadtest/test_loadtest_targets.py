"""Targets: the serve config's engine args as vLLM CLI flags, SLO from the config, tenant set-up."""
import json
import tarfile
from pathlib import Path

import httpx
import pytest

from bench.loadtest import targets, workload as wl

ROOT = Path(__file__).resolve().parents[4]


def test_bare_vllm_gets_the_serve_configs_engine_args():
    _, args = targets.load_serve_config(ROOT / "serve_config.yaml")
    eng = targets.engine_config(args, ROOT)
    argv = targets.bare_vllm_argv(eng.engine_args(), 8200, {"t0-lt-0": Path("/a/p")})
    assert argv[1:4] == ["-m", "vllm.entrypoints.openai.api_server", "--host"]
    for k, v in eng.engine_args().items():
        flag = "--" + k.replace("_", "-")
        if isinstance(v, bool):
            assert (flag if v else "--no-" + k.replace("_", "-")) in argv
        elif isinstance(v, list):
            assert argv[argv.index(flag) + 1:argv.index(flag) + 1 + len(v)] == v
        else:
            assert argv[argv.index(flag) + 1] == str(v)
    assert "--max-num-seqs" in argv and "--dtype" in argv and "--enable-lora" in argv
    assert argv[-2:] == ["--lora-modules", "t0-lt-0=/a/p"]
    extra = targets.bare_vllm_argv({"enable_prefix_caching": False, "kv_cache_memory_bytes": 5,
                                    "compilation_config": {"level": 0}}, 1, {})
    assert "--no-enable-prefix-caching" in extra and extra[extra.index("--compilation-config") + 1] == '{"level": 0}'


def test_bare_vllm_at_its_defaults_and_with_the_engines_dtype_threads_and_environment(monkeypatch):
    from loraplex.engine.cpu_backend import CPU_BACKEND_ENV, node_cpus, resolve_cpu_dtype

    for var in ("OMP_NUM_THREADS", *CPU_BACKEND_ENV):
        monkeypatch.delenv(var, raising=False)
    _, args = targets.load_serve_config(ROOT / "serve_config.yaml")
    eng = targets.engine_config(args, ROOT)
    shipped = eng.engine_args()
    defaults, env = targets.bare_vllm_launch(eng, "defaults")
    assert env == {} and "dtype" not in defaults  # vLLM's own dtype and threads
    assert defaults == {k: v for k, v in shipped.items() if k != "dtype"}
    same, env = targets.bare_vllm_launch(eng, "same-args")
    assert same["dtype"] == resolve_cpu_dtype(shipped["dtype"])[0] != "auto"
    assert env == {"OMP_NUM_THREADS": str(len(node_cpus())), **CPU_BACKEND_ENV}
    assert targets.bare_vllm_launch(eng, "same-args", pool_cpus=[1])[1]["OMP_NUM_THREADS"] == "1"
    monkeypatch.setenv("OMP_NUM_THREADS", "7")  # the caller's own setting is kept
    assert "OMP_NUM_THREADS" not in targets.bare_vllm_launch(eng, "same-args")[1]
    with pytest.raises(SystemExit, match="one of defaults, same-args"):
        targets.bare_vllm_launch(eng, "tuned")


@pytest.mark.parametrize("slo,expect", [
    ({}, {}),
    ({"ttft_p95_s": 1.5, "tpot_p95_ms": 80}, {"ttft_p95": 1.5, "tpot_p95": 0.08}),
    ({"ttft_p95": 2, "tpot_p95_s": 0.1}, {"ttft_p95": 2.0, "tpot_p95": 0.1}),
])
def test_slo_from_the_config(slo, expect):
    assert targets.slo_from_config({"slo": slo} if slo else {}) == pytest.approx(expect)


def test_a_config_without_the_platform_app_is_refused(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("applications:\n  - name: x\n    import_path: other:app\n")
    with pytest.raises(SystemExit, match="loraplex.app"):
        targets.load_serve_config(cfg)


def test_platform_target_creates_tenants_keys_and_uploads_their_adapters(tmp_path, monkeypatch):
    archive = tmp_path / "a.tar.gz"
    archive.write_bytes(b"x")
    calls = []

    def handle(request: httpx.Request):
        calls.append((request.method, request.url.path, request.headers.get("authorization")))
        if request.url.path == "/admin/tenants":
            return httpx.Response(201, json={"id": f"ten_{len(calls)}"})
        if request.url.path.endswith("/keys"):
            return httpx.Response(201, json={"key": f"lpx-{request.url.path.split('/')[3]}"})
        assert b'name="name"' in request.content and b"lt-0" in request.content
        return httpx.Response(201, json={"name": "lt-0"})

    real = httpx.Client
    monkeypatch.setattr(httpx, "Client", lambda **kw: real(transport=httpx.MockTransport(handle), **kw))
    tenants = [wl.Tenant("tenant-0", "s", [0]), wl.Tenant("tenant-1", "s", [])]
    w = wl.Workload(tenants, [(0, 0)], [], "t", True)
    t = targets.platform_target("http://x", "base", w, admin_token="adm", adapter_archives=[archive], run_id="r1")
    assert t.keys == ["lpx-ten_1", "lpx-ten_3"] and t.adapter_models == {0: "lt-0"}
    assert calls[-1] == ("POST", "/v1/adapters", "Bearer lpx-ten_1")  # with the owner's key
    assert all(auth == "Bearer adm" for _, path, auth in calls[:-1])
    # without the admin token: given keys and existing adapter names
    t = targets.platform_target("http://x", "base", w, api_keys=["k1"], adapter_names=["mine"])
    assert t.keys == ["k1"] and t.adapter_models == {0: "mine"}
    with pytest.raises(SystemExit, match="adapter"):
        targets.platform_target("http://x", "base", w, api_keys=["k1"])


def test_unpack_adapter_finds_the_peft_dir(tmp_path):
    src = tmp_path / "src" / "pirate"
    src.mkdir(parents=True)
    (src / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA"}))
    archive = tmp_path / "p.tar.gz"
    with tarfile.open(archive, "w:gz") as t:
        t.add(src, arcname="pirate")
    assert targets.unpack_adapter(archive, tmp_path / "out") == tmp_path / "out" / "pirate"


def test_the_plan_is_for_the_base_model_named_with_several_bases():
    """Several bases (issue 35): --model picks the base whose engine args (tokenizer, max_model_len,
    GPUs) and price profile the plan uses; a name that is none of them exits naming them."""
    args = {"models": [
        {"engine": {"model": "HuggingFaceTB/SmolLM2-135M-Instruct", "max_model_len": 2048}},
        {"name": "big", "engine": {"model": "org/big-model", "max_model_len": 8192, "tensor_parallel_size": 2},
         "engine_deployment": {"num_gpus": 2}}]}
    assert targets.engine_config(args, ROOT).model_id == "SmolLM2-135M-Instruct"  # the default: the first
    big = targets.engine_config(args, ROOT, "big")
    assert (big.model, big.max_model_len, big.tensor_parallel_size) == ("org/big-model", 8192, 2)
    assert targets.cost_model(args, "big").hardware != targets.cost_model(args).hardware  # a GPU's hour, a VM's
    with pytest.raises(SystemExit, match="SmolLM2-135M-Instruct, big"):
        targets.engine_config(args, ROOT, "gpt-9")
    # One base: any name is it (an external target may serve it under another name).
    one = {"engine": {"model": "org/m", "max_model_len": 1024}}
    assert targets.engine_config(one, ROOT, "served-as").max_model_len == 1024
