from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from loraplex.config import PlatformConfig
from loraplex.engine.config import EngineConfig

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", ["serve_config.yaml", "serve_config.gpu.yaml"])
def test_shipped_serve_configs_parse(name):
    config = yaml.safe_load((ROOT / name).read_text())
    app = config["applications"][0]
    assert app["import_path"] == "loraplex.app:build_app"
    platform = PlatformConfig.from_args(app["args"])
    args = platform.engine.engine_args()
    assert args["enable_lora"] and args["enable_prefix_caching"] and args["enable_chunked_prefill"]
    assert args["served_model_name"] == ["SmolLM2-135M-Instruct"]
    # Replica counts are scaled in place through `deployments:`; under `args` a change would
    # replace every replica (Serve hashes args into the app's version).
    assert "num_replicas" not in app["args"]["engine_deployment"] and "num_replicas" not in app["args"]["ingress"]
    assert {d["name"] for d in app["deployments"] if "num_replicas" in d} == {"Engine", "Ingress"}


def test_gpu_profile_reserves_one_gpu_per_tensor_parallel_rank():
    config = yaml.safe_load((ROOT / "serve_config.gpu.yaml").read_text())
    platform = PlatformConfig.from_args(config["applications"][0]["args"])
    assert platform.engine_deployment.num_gpus == platform.engine.tensor_parallel_size


def test_engine_args_pass_through_and_lora_knobs():
    engine = EngineConfig(
        model="some/model",
        max_loras=2,
        max_cpu_loras=8,
        max_lora_rank=32,
        engine_kwargs={"enforce_eager": True},
    )
    args = engine.engine_args()
    assert args["max_loras"] == 2 and args["max_cpu_loras"] == 8 and args["max_lora_rank"] == 32
    assert args["enforce_eager"] is True
    assert engine.model_id == "model"


def test_lora_knobs_absent_when_lora_disabled():
    args = EngineConfig(enable_lora=False).engine_args()
    assert "max_loras" not in args and args["enable_lora"] is False


def test_served_model_name_overrides_dir_name():
    assert EngineConfig(model="/m/x", served_model_name="base").model_id == "base"


def test_unknown_keys_are_refused_so_typos_surface():
    with pytest.raises(ValidationError, match="max_lora"):
        PlatformConfig.from_args({"engine": {"max_lora": 3}})


def test_bad_values_are_refused():
    with pytest.raises(ValidationError):
        PlatformConfig.from_args({"engine": {"gpu_memory_utilization": 1.5}})
    with pytest.raises(ValidationError):
        PlatformConfig.from_args({"engine_deployment": {"num_replicas": 0}})


def test_relative_model_dir_resolves_against_start_dir(tmp_path):
    (tmp_path / "models" / "m").mkdir(parents=True)
    resolved = EngineConfig(model="models/m").resolved(tmp_path)
    assert resolved.model == str(tmp_path / "models" / "m")
    # An HF id (no such dir) is left alone.
    assert EngineConfig(model="org/model").resolved(tmp_path).model == "org/model"


def test_empty_args_give_the_cpu_defaults():
    platform = PlatformConfig.from_args(None)
    assert platform.engine.model == "models/SmolLM2-135M-Instruct"
    assert platform.engine_deployment.num_replicas == 1


def test_a_shed_threshold_the_fair_queue_makes_unreachable_is_refused_with_the_fix():
    # With the fair queue on, vLLM holds at most max_num_seqs of a replica's requests: 384 of 256
    # would be stored and never shed anyone (the GPU profile had it).
    too_high = {"engine": {"max_num_seqs": 256},
                "engine_deployment": {"shedding": {"shed_requests": 384, "max_requests": 1024}}}
    with pytest.raises(ValidationError, match="shed_requests=384 can never be reached.*fair_queue.max_queued"):
        PlatformConfig.from_args(too_high)
    PlatformConfig.from_args({"engine": {"max_num_seqs": 4},  # below: priority 0 refused before the batch fills
                              "engine_deployment": {"shedding": {"shed_requests": 1, "max_requests": 64}}})
    too_high["engine_deployment"]["fair_queue"] = {"enabled": False}  # vLLM's own waiting queue: reachable
    PlatformConfig.from_args(too_high)
    PlatformConfig.from_args({})  # the default 48 was not the operator's choice


def test_engine_kwargs_may_not_shadow_a_typed_engine_field():
    # The fair queue caps dispatch at engine.max_num_seqs: vLLM must not get another value.
    with pytest.raises(ValidationError, match="engine_kwargs sets max_num_seqs: set engine.max_num_seqs"):
        EngineConfig(engine_kwargs={"max_num_seqs": 64, "enforce_eager": True})
    assert EngineConfig(engine_kwargs={"enforce_eager": True}).engine_args()["enforce_eager"] is True


def test_the_tenant_scheduler_gets_the_slo_tpot_target_and_its_settings_take_effect():
    platform = PlatformConfig.from_args({"slo": {"tpot_p95_s": 0.5},
                                         "engine": {"tenant_scheduler": {"step_share": 0.5, "min_prompt_tokens": 8,
                                                                         "max_prompt_tokens": 512}}})
    settings = platform.for_replicas().engine.tenant_scheduler.settings()
    assert settings["step_target_s"] == 0.25 and settings["min_prompt_tokens"] == 8
    assert settings["max_prompt_tokens"] == 512
    own = PlatformConfig.from_args({"engine": {"tenant_scheduler": {"tpot_s": 0.1}}}).for_replicas()
    assert own.engine.tenant_scheduler.settings()["step_target_s"] == pytest.approx(0.08)  # its own target wins
    with pytest.raises(ValidationError, match="scheduler_cls replaces the tenant scheduler"):
        EngineConfig(engine_kwargs={"scheduler_cls": "my.Scheduler"})
    EngineConfig(tenant_scheduler={"enabled": False}, engine_kwargs={"scheduler_cls": "my.Scheduler"})


def test_the_fair_queue_dispatch_limit_is_max_num_seqs_a_number_or_adaptive():
    from loraplex.engine.deployment import Engine
    from loraplex.engine.dispatch_limit import AdaptiveLimit

    config = PlatformConfig.from_args({"engine": {"max_num_seqs": 12}, "engine_deployment": {"fair_queue": {
        "newcomer_slots": 3}}})
    queue = Engine._fair_queue(config)
    assert queue.limit() == 12 and queue.max_num_seqs == 15  # the reserve beside a full batch
    assert Engine.engine_config(config).max_num_seqs == 15  # and vLLM has room for it
    adaptive = PlatformConfig.from_args({"engine_deployment": {"fair_queue": {"dispatch_limit": "adaptive"}}})
    assert isinstance(Engine._fair_queue(adaptive).limit, AdaptiveLimit)
    with pytest.raises(ValidationError, match="dispatch_limit must be at least 1"):
        PlatformConfig.from_args({"engine_deployment": {"fair_queue": {"dispatch_limit": 0}}})


def test_secrets_never_show_in_the_configs_repr():
    """Least privilege (issue 34): the admin token is a SecretStr, the database URL (a password) and
    the store's storage_options (S3 keys) are left out of repr(), so a logged config leaks none."""
    from loraplex.tenancy.tenancy import Tenancy

    config = PlatformConfig.from_args({
        "tenancy": {"admin_token": "tok-s3cr3t"},
        "database_url": "postgresql://app:pw-s3cr3t@db:5432/loraplex",
        "registry": {"storage_options": {"key": "AKIA", "secret": "aws-s3cr3t"}},
    })
    shown = repr(config) + str(config) + repr(config.tenancy) + repr(config.registry)
    for secret in ("tok-s3cr3t", "pw-s3cr3t", "aws-s3cr3t"):
        assert secret not in shown
    assert config.tenancy.resolved_admin_token() == "tok-s3cr3t"  # still usable where it is needed
    assert "tok-s3cr3t" not in repr(Tenancy(service=None, admin_token="tok-s3cr3t", keys=object()))


# -- several base models (issue 35) -------------------------------------------------------------
def two_bases(**extra):
    return PlatformConfig.from_args({"models": [
        {"engine": {"model": "models/small"}, "engine_deployment": {"num_replicas": 2}},
        {"name": "large", "engine": {"model": "/m/large", "max_num_seqs": 8},
         "engine_deployment": {"num_cpus": 0.5}},
    ], **extra})


def test_the_single_model_form_is_one_base_on_the_engine_pool():
    config = PlatformConfig.from_args({"engine": {"model": "models/small"}})
    assert config.base_names == ["small"] and config.pool_name() == "Engine" == config.pool_name("small")
    assert config.base().engine is config.engine


def test_models_lists_bases_each_with_its_own_pool_and_settings():
    config = two_bases()
    assert config.base_names == ["small", "large"]
    assert [config.pool_name(n) for n in config.base_names] == ["Engine", "Engine-large"]
    # Code that serves one base reads engine / engine_deployment: the first's.
    assert config.engine.model == "models/small" and config.engine_deployment.num_replicas == 2
    large = config.for_model("large")
    assert large.engine.model == "/m/large" and large.engine.max_num_seqs == 8
    assert large.engine_deployment.num_cpus == 0.5 and large.base_names == ["small", "large"]
    # Every pool's replicas get the TPOT target, not only the first's.
    replicas = config.for_replicas()
    assert all(b.engine.tenant_scheduler.tpot_s == config.slo.tpot_p95_s for b in replicas.bases())
    assert all(b.engine_deployment.num_replicas == 1 for b in replicas.bases())
    with pytest.raises(KeyError, match="small, large"):
        config.base("nope")


def test_a_config_with_two_bases_of_one_name_is_refused_naming_the_entries():
    with pytest.raises(ValidationError, match=r"models\[1\] and models\[0\] are both named 'small'"):
        PlatformConfig.from_args({"models": [{"engine": {"model": "a/small"}}, {"engine": {"model": "b/small"}}]})
    with pytest.raises(ValidationError, match="name 'x' and engine.served_model_name 'y' differ"):
        PlatformConfig.from_args({"models": [{"name": "x", "engine": {"served_model_name": "y"}}]})


def test_engine_beside_models_is_refused_rather_than_ignored():
    with pytest.raises(ValidationError, match="engine_deployment set beside `models:`"):
        PlatformConfig.from_args({"engine_deployment": {"num_replicas": 3},
                                  "models": [{"engine": {"model": "a"}}]})


def test_each_pools_unreachable_shedding_threshold_is_refused_by_its_entry():
    with pytest.raises(ValidationError, match=r"models\[1\].engine_deployment.shedding.shed_requests=8"):
        PlatformConfig.from_args({"models": [
            {"engine": {"model": "a"}},
            {"engine": {"model": "b", "max_num_seqs": 8}, "engine_deployment": {"shedding": {"shed_requests": 8}}}]})


def test_a_price_for_a_base_the_app_does_not_serve_is_refused():
    pricing = {"plans": {"default": {"input": "1", "cached_input": "0.5", "output": "2",
                                     "models": {"larg": {"input": "3"}}}}}
    with pytest.raises(ValidationError, match="prices base model.*larg.*its bases: small, large"):
        two_bases(accounting={"pricing": pricing})
    pricing["plans"]["default"]["models"] = {"large": {"input": "3"}}
    assert two_bases(accounting={"pricing": pricing}).accounting.pricing.priced_models() == {"large"}


def test_a_plans_per_base_limit_on_an_unknown_base_is_refused_naming_the_field():
    def config(base):
        return PlatformConfig.from_args({
            "models": [{"engine": {"model": "a/small"}}, {"engine": {"model": "b/large"}}],
            "tenancy": {"plans": {"free": {"limits": {"models": {base: {"requests_per_minute": 5}}}}}}})

    assert config("large").tenancy.plans["free"].limits.for_base("large").requests_per_minute == 5
    with pytest.raises(ValidationError, match=r"tenancy.plans.free.limits.models: unknown base model 'lage'; "
                                              "the bases are small, large"):
        config("lage")
    with pytest.raises(ValidationError, match="cost_model.models names larg"):
        two_bases(accounting={"cost_model": {"models": {"larg": {"gpus": 1}}}})


@pytest.mark.parametrize("profile", ["serve_config.yaml", "serve_config.gpu.yaml", "serve_config.cluster.yaml",
                                     "serve_config.multi.yaml"])
def test_every_shipped_profile_caps_a_request_and_a_tenants_share_of_a_replica(profile):
    """Issue 46: without caps one tenant's `n: 16000` or 1,000 prompts held the whole replica and
    every other tenant was refused. The default plan caps n, prompts and sequences per request
    (never past a pool's max_num_seqs, the server's bound) and holds a tenant to half a batch."""
    import yaml

    args = yaml.safe_load((ROOT / profile).read_text())["applications"][0]["args"]
    config = PlatformConfig.from_args(args)
    limits = config.tenancy.plans["default"].limits
    batch = min(base.engine.max_num_seqs for base in config.bases())
    assert None not in (limits.max_n, limits.max_prompts_per_request, limits.max_sequences_per_request)
    assert limits.max_sequences_per_request <= batch and limits.max_n <= limits.max_sequences_per_request
    assert limits.max_concurrent_requests is not None and limits.max_concurrent_requests <= batch // 2
