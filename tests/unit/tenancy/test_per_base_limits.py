"""Per-base limits in a tenant's limits (TenantLimits.models, issue 35): merged over the plan's and
by PATCH per base and per field like the others; a base not in the config is refused with the
bases named."""

import pytest

from loraplex.db.engine import make_engine
from loraplex.tenancy.models import TenantLimits
from loraplex.tenancy.service import InvalidTenantField, TenantService

A, B = "small", "tiny"


@pytest.fixture
def service(db_url):
    engine = make_engine(db_url)
    yield TenantService(engine, known_bases=[A, B])
    engine.dispose()


def test_own_per_base_limits_win_over_the_plans_field_by_field():
    plan = TenantLimits(models={A: {"requests_per_minute": 10, "monthly_token_budget": 1000}, B: {"tokens_per_minute": 5}})
    own = TenantLimits(models={A: {"requests_per_minute": 3}})
    effective = own.over(plan)
    assert effective.for_base(A).model_dump() == {"requests_per_minute": 3, "tokens_per_minute": None,
                                                  "max_concurrent_requests": None, "monthly_token_budget": 1000}
    assert effective.for_base(B).tokens_per_minute == 5
    assert TenantLimits().over(plan).models == plan.models  # none of its own: the plan's
    assert own.over(TenantLimits()).models == own.models
    assert effective.for_base("other") is None and effective.for_base(None) is None


def test_patch_merges_per_base_and_per_field_and_null_clears():
    limits = TenantLimits(models={A: {"requests_per_minute": 3, "tokens_per_minute": 100}, B: {"max_concurrent_requests": 1}})
    patched = limits.merged({"models": {A: {"requests_per_minute": 5}}})
    assert patched.for_base(A).requests_per_minute == 5 and patched.for_base(A).tokens_per_minute == 100
    assert patched.for_base(B).max_concurrent_requests == 1
    assert set(limits.merged({"models": {A: None}}).models) == {B}
    assert limits.merged({"models": None}).models is None
    assert limits.merged({"requests_per_minute": 9}).models == limits.models  # not named: kept


def test_unknown_base_is_400_naming_the_bases_on_create_and_update(service):
    with pytest.raises(InvalidTenantField) as e:
        service.create_tenant("acme", limits={"models": {"smal": {"requests_per_minute": 1}}})
    assert e.value.status == 400
    assert "limits.models: unknown base model 'smal'; the bases are small, tiny" in str(e.value)
    tenant = service.create_tenant("acme", limits={"models": {A: {"requests_per_minute": 1}}})
    with pytest.raises(InvalidTenantField) as e:
        service.update_tenant(tenant.id, limits={"models": {"huge": {"tokens_per_minute": 1}}})
    assert "unknown base model 'huge'; the bases are small, tiny" in str(e.value)
    assert set(service.get_tenant(tenant.id).limits.models) == {A}  # nothing stored


def test_a_stored_base_that_left_the_config_does_not_block_other_changes(db_url):
    engine = make_engine(db_url)
    old = TenantService(engine, known_bases=[A, "retired"])
    tenant = old.create_tenant("acme", limits={"models": {"retired": {"requests_per_minute": 1}}})
    now = TenantService(engine, run_migrations=False, known_bases=[A])
    assert now.update_tenant(tenant.id, limits={"requests_per_minute": 5}).limits.requests_per_minute == 5
    assert now.update_tenant(tenant.id, limits={"models": {"retired": None}}).limits.models is None
    engine.dispose()


def test_a_bad_per_base_value_names_its_field(service):
    with pytest.raises(InvalidTenantField) as e:
        service.create_tenant("acme", limits={"models": {A: {"requests_per_minute": 0}}})
    assert "limits.models.small.requests_per_minute" in str(e.value)
    with pytest.raises(InvalidTenantField) as e:
        service.create_tenant("acme", limits={"models": {A: {"priority": 5}}})  # tenant-wide only
    assert "limits.models.small.priority" in str(e.value)
