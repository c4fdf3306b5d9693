"""The generated rules pass `promtool check rules`, and `promtool test rules` fires every alert
(KV cache, TTFT / TPOT over the SLO, errors, sheds, budget burn, replica and target down,
spool) on synthetic series, for the shipped configs, one with a tenant price override and one
with per-base prices."""
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/: shared helpers
from prometheus_server import prometheus_tool  # noqa: E402

from loraplex.config import PlatformConfig  # noqa: E402
from loraplex.observability.generated import RULE_TESTS, RULES, write_generated  # noqa: E402
from loraplex.observability.rule_tests import render_rule_tests  # noqa: E402
from loraplex.observability.rules import render_rules  # noqa: E402
from loraplex.observability.served import ServedPlatform, load_served  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]


def promtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([prometheus_tool("promtool"), *args], capture_output=True, text=True, timeout=120)


def assert_ok(result: subprocess.CompletedProcess) -> None:
    assert result.returncode == 0, result.stdout + result.stderr


def test_checked_in_rules_pass_check_and_their_tests():
    assert_ok(promtool("check", "rules", str(ROOT / "deploy" / RULES)))
    assert_ok(promtool("test", "rules", str(ROOT / "deploy" / RULE_TESTS)))


def _override_platform() -> ServedPlatform:
    return ServedPlatform("lpx", PlatformConfig.from_args({
        "engine_deployment": {"num_replicas": 3}, "ingress": {"num_replicas": 2},
        "slo": {"for_s": 60, "window_s": 120, "spool_flush_max_age_s": 45},
        "accounting": {"pricing": {"currency": "EUR", "tenant_overrides": {
            "ten_0123456789abcdef": {"input": "0.30", "cached_input": "0.03", "output": "0.90"}}}}}))


def _per_base_prices_platform() -> ServedPlatform:
    """Per-base prices in the plan and in an override: the cost rule prices each base apart."""
    return ServedPlatform("lpx", PlatformConfig.from_args({"models": [
        {"engine": {"model": "models/SmolLM2-135M-Instruct"}}, {"name": "big", "engine": {"model": "models/big"}}],
        "accounting": {"pricing": {
        "plans": {"default": {"input": "0.50", "cached_input": "0.05", "output": "1.50",
                              "models": {"big": {"input": "2", "output": "6"}}}},
        "tenant_overrides": {
            "ten_0123456789abcdef": {"input": "0.30", "cached_input": "0.03", "output": "0.90",
                                     "models": {"big": {"output": "4"}}},
            "ten_fedcba9876543210": {"input": "0.20", "cached_input": "0.02", "output": "0.60"}}}}}))


@pytest.mark.parametrize("served", [load_served(ROOT / "serve_config.gpu.yaml"), _override_platform(),
                                    _per_base_prices_platform()],
                         ids=["gpu-profile", "override-prices", "per-base-prices"])
def test_generated_rules_pass_for_other_configs(tmp_path, served):
    write_generated(served, tmp_path)
    assert_ok(promtool("check", "rules", str(tmp_path / RULES)))
    assert_ok(promtool("test", "rules", str(tmp_path / RULE_TESTS)))


def test_the_rule_tests_bite(tmp_path):
    """Rules generated with other thresholds than the tests expect make promtool fail."""
    strict = load_served(ROOT / "serve_config.yaml")
    loose = ServedPlatform(strict.application, strict.config.model_copy(update={
        "slo": strict.config.slo.model_copy(update={"kv_usage_alert": 0.99, "ttft_p95_s": 100.0})}))
    (tmp_path / "prometheus").mkdir()
    (tmp_path / RULES).write_text(render_rules(loose))
    (tmp_path / RULE_TESTS).write_text(render_rule_tests(strict))
    result = promtool("test", "rules", str(tmp_path / RULE_TESTS))
    assert result.returncode != 0
    assert "LoraplexKVCacheNearlyFull" in result.stdout + result.stderr
    assert "LoraplexTTFTOverSLO" in result.stdout + result.stderr
