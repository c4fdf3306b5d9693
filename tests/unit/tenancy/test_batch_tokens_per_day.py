"""batch_tokens_per_day (issue 36) is a tenant limit like the others: stored, patched, cleared,
taken from the plan when the tenant sets none, and at least 1."""

import pytest

from loraplex.tenancy.models import TenantLimits
from loraplex.tenancy.service import InvalidTenantField


def test_it_round_trips_patches_and_clears(service):
    tenant = service.create_tenant("acme", limits={"batch_tokens_per_day": 1000})
    assert service.get_tenant(tenant.id).limits.batch_tokens_per_day == 1000
    raised = service.update_tenant(tenant.id, limits={"batch_tokens_per_day": 5000, "priority": 1})
    assert raised.limits.batch_tokens_per_day == 5000
    assert service.update_tenant(tenant.id, limits={"priority": 2}).limits.batch_tokens_per_day == 5000  # kept
    assert service.update_tenant(tenant.id, limits={"batch_tokens_per_day": None}).limits.batch_tokens_per_day is None


def test_the_plans_applies_unless_the_tenant_sets_its_own(service):
    service.plans["default"] = TenantLimits(batch_tokens_per_day=300)
    plain = service.create_tenant("plain")
    own = service.create_tenant("own", limits={"batch_tokens_per_day": 900})
    assert service.effective_limits(plain.plan, plain.limits).batch_tokens_per_day == 300
    assert service.effective_limits(own.plan, own.limits).batch_tokens_per_day == 900


def test_zero_is_refused_naming_the_field(service):
    with pytest.raises(InvalidTenantField, match="limits.batch_tokens_per_day"):
        service.create_tenant("acme", limits={"batch_tokens_per_day": 0})
