"""SLO classes in config: the single `slo:` is one class; plans and tenants name theirs; an unknown
class is refused at start; the shipped profiles' classes."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from loraplex.config import PlatformConfig
from loraplex.contract import SloTargets
from loraplex.ingress.tenant_context import TenantContext
from loraplex.observability.config import SloConfig
from loraplex.tenancy.models import Principal, TenantLimits

ROOT = Path(__file__).resolve().parents[3]


def test_the_single_slo_is_one_class():
    slo = SloConfig(ttft_p95_s=2.5, tpot_p95_s=0.3)
    assert list(slo.resolved_classes()) == ["standard"]
    assert slo.targets(None) == SloTargets("standard", 2.5, 0.3)
    assert slo.targets("nonesuch") == SloTargets("standard", 2.5, 0.3)


def test_classes_and_the_default_one():
    slo = SloConfig(classes={"interactive": {"ttft_p95_s": 1.0, "tpot_p95_s": 0.3}, "batch": {}},
                    default_class="batch")
    assert slo.targets(None) == SloTargets("batch", None, None)
    assert slo.targets("interactive") == SloTargets("interactive", 1.0, 0.3)
    with pytest.raises(ValueError, match="default_class"):
        SloConfig(classes={"chat": {}}, default_class="gold")


def test_a_plan_names_its_class_and_a_tenant_may_override_it():
    config = PlatformConfig(slo={"classes": {"chat": {"ttft_p95_s": 2.5}, "interactive": {"ttft_p95_s": 1.0}},
                                 "default_class": "chat"},
                            tenancy={"plans": {"complete": {"limits": {"slo_class": "interactive"}}}})
    tenants = TenantContext(None, None, base_model="base", slo_targets=config.slo.targets)
    plan = config.tenancy.plans["complete"].limits

    def principal(own: TenantLimits, plan_limits=None) -> Principal:
        return Principal("t", "t", "complete", own.over(plan_limits), "k")

    assert tenants.slo(principal(TenantLimits(), plan)).name == "interactive"  # the plan's
    assert tenants.slo(principal(TenantLimits(slo_class="chat"), plan)).name == "chat"  # the tenant's own
    assert tenants.slo(principal(TenantLimits())).name == "chat"  # neither: the default
    with pytest.raises(ValueError, match="unknown class 'gold'"):
        PlatformConfig(tenancy={"plans": {"p": {"limits": {"slo_class": "gold"}}}})


@pytest.mark.parametrize("profile", ["serve_config.yaml", "serve_config.gpu.yaml"])
def test_the_shipped_profiles_have_classes(profile):
    args = yaml.safe_load((ROOT / profile).read_text())["applications"][0]["args"]
    slo = PlatformConfig.model_validate(args).slo
    classes = slo.resolved_classes()
    assert {"interactive", "chat", "agent", "batch"} <= set(classes)
    assert classes["batch"].ttft_p95_s is None and classes["batch"].tpot_p95_s is None
    assert classes["interactive"].ttft_p95_s < classes["chat"].ttft_p95_s < classes["agent"].ttft_p95_s
