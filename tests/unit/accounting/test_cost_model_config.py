"""The cost model prices the hardware of the profile: a 2-vCPU VM on the CPU profile (the default),
a GPU where Engine replicas have GPUs, unless accounting.cost_model says otherwise."""
from decimal import Decimal
from pathlib import Path

import pytest
import yaml

from loraplex.accounting.config import (CPU_PROFILE_HARDWARE, CPU_PROFILE_HOUR_PRICE, GPU_PROFILE_HARDWARE,
                                        GPU_PROFILE_HOUR_PRICE)
from loraplex.config import PlatformConfig

ROOT = Path(__file__).resolve().parents[3]


def cost_model(args):
    return PlatformConfig.from_args(args).accounting.cost_model


def test_unset_cost_model_follows_the_profile():
    cpu = cost_model(None)  # the default profile: num_gpus 0
    assert (cpu.hardware, cpu.gpu_hour_price) == (CPU_PROFILE_HARDWARE, CPU_PROFILE_HOUR_PRICE)
    gpu = cost_model({"engine_deployment": {"num_gpus": 1}})
    assert (gpu.hardware, gpu.gpu_hour_price) == (GPU_PROFILE_HARDWARE, GPU_PROFILE_HOUR_PRICE)
    # A CPU VM's hour is not a GPU's: the issue was a CPU install priced at 3.50/h.
    assert CPU_PROFILE_HOUR_PRICE < Decimal(1) < GPU_PROFILE_HOUR_PRICE


def test_what_the_config_sets_wins_over_the_profile():
    gpu = cost_model({"engine_deployment": {"num_gpus": 2},
                      "accounting": {"cost_model": {"gpu_hour_price": "2.10", "gpus": 2}}})
    assert (gpu.hardware, gpu.gpu_hour_price, gpu.gpus) == (GPU_PROFILE_HARDWARE, Decimal("2.10"), 2)
    named = cost_model({"engine_deployment": {"num_gpus": 1}, "accounting": {"cost_model": {"hardware": "H100"}}})
    assert (named.hardware, named.gpu_hour_price) == ("H100", GPU_PROFILE_HOUR_PRICE)
    cpu = cost_model({"accounting": {"cost_model": {"gpu_hour_price": "0.20", "hardware": "4-vCPU VM"}}})
    assert (cpu.hardware, cpu.gpu_hour_price) == ("4-vCPU VM", Decimal("0.20"))


@pytest.mark.parametrize("name, hardware, price", [("serve_config.yaml", CPU_PROFILE_HARDWARE, CPU_PROFILE_HOUR_PRICE),
                                                   ("serve_config.gpu.yaml", GPU_PROFILE_HARDWARE,
                                                    GPU_PROFILE_HOUR_PRICE)])
def test_shipped_profiles_price_their_own_hardware(name, hardware, price):
    args = yaml.safe_load((ROOT / name).read_text())["applications"][0]["args"]
    assert (cost_model(args).hardware, cost_model(args).gpu_hour_price) == (hardware, price)
    # ... and say so in the file, where an operator changes it (the loadtest reads it from there too).
    assert Decimal(str(args["accounting"]["cost_model"]["gpu_hour_price"])) == price


def test_the_loadtest_prices_as_the_platform_does():
    from bench.loadtest import targets

    for args in (None, {"engine_deployment": {"num_gpus": 1}},
                 {"engine_deployment": {"num_gpus": 1}, "accounting": {"cost_model": {"gpu_hour_price": "2"}}}):
        assert targets.cost_model(args or {}) == cost_model(args)
