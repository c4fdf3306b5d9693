import hashlib
import threading
from unittest import mock

import pytest
from sqlalchemy import select

from loraplex.db.engine import make_engine
from loraplex.db.migrations import applied_versions
from loraplex.tenancy.config import TenancyConfig
from loraplex.tenancy.models import TenantLimits
from loraplex.tenancy.service import DuplicateTenantName, InvalidAPIKey, InvalidTenantField, TenantService, TenantSuspended, UnknownKey, UnknownTenant
from loraplex.tenancy import keys as key_material
from loraplex.tenancy.models import api_keys

LIMITS = {"requests_per_minute": 60, "tokens_per_minute": 10_000, "max_concurrent_requests": 4,
          "monthly_token_budget": 1_000_000, "priority": 2, "max_adapter_versions": 20,
          "max_adapter_bytes": 1 << 30,
          # the per-request caps (issue 34)
          "max_n": 2, "max_prompts_per_request": 8, "max_tokens_per_request": 512, "max_sequences_per_request": 4,
          # the Batch API's (issue 36)
          "max_batch_files": 3, "max_batch_file_bytes": 1 << 20, "max_batches_in_flight": 2,
          "batch_tokens_per_day": 50_000,
          # the SLO class its requests are served and counted by (issue 51)
          "slo_class": "interactive",
          # per base model (issue 35)
          "models": {"tiny": {"requests_per_minute": 6, "tokens_per_minute": None, "max_concurrent_requests": 1,
                              "monthly_token_budget": 1000}}}


def test_create_get_list_tenant(service):
    tenant = service.create_tenant("acme", plan="pro", limits=LIMITS)
    assert tenant.id.startswith("ten_") and tenant.status == "active" and tenant.plan == "pro"
    assert tenant.limits.model_dump() == LIMITS
    assert tenant.created_at.tzinfo is not None and tenant.created_at == tenant.updated_at
    assert service.get_tenant(tenant.id) == tenant
    other = service.create_tenant("globex")
    assert other.plan == "default"
    assert other.limits == TenantLimits()  # all unlimited, priority 0
    assert [t.name for t in service.list_tenants()] == ["acme", "globex"]
    assert service.plan_of(tenant.id) == "pro" and service.plan_of("ten_nope") is None


def test_tenant_json_has_every_design_limit_key(service):
    body = service.create_tenant("acme").to_json()
    assert set(body["limits"]) == set(LIMITS)
    assert body["created_at"].endswith("+00:00")


def test_duplicate_name_is_409(service):
    service.create_tenant("acme")
    with pytest.raises(DuplicateTenantName) as e:
        service.create_tenant("acme")
    assert e.value.status == 409 and "acme" in e.value.message


@pytest.mark.parametrize("kwargs, where", [
    ({"name": "Acme"}, "name"),
    ({"name": ""}, "name"),
    ({"name": "a" * 65}, "name"),
    ({"name": "ok", "limits": {"request_per_minute": 5}}, "limits.request_per_minute"),
    ({"name": "ok", "limits": {"requests_per_minute": 0}}, "limits.requests_per_minute"),
    ({"name": "ok", "limits": {"priority": "high"}}, "limits.priority"),
    ({"name": "ok", "plan": ""}, "plan"),
])
def test_invalid_fields_are_400_and_name_the_field(service, kwargs, where):
    with pytest.raises(InvalidTenantField) as e:
        service.create_tenant(**kwargs)
    assert e.value.status == 400 and e.value.message.startswith(where)
    assert service.list_tenants() == []


def test_update_merges_limits_and_changes_plan(service):
    tenant = service.create_tenant("acme", limits={"requests_per_minute": 60, "tokens_per_minute": 100})
    updated = service.update_tenant(tenant.id, plan="pro", limits={"tokens_per_minute": None, "priority": 5})
    assert updated.plan == "pro"
    assert updated.limits.requests_per_minute == 60  # untouched
    assert updated.limits.tokens_per_minute is None  # null clears
    assert updated.limits.priority == 5
    assert updated.updated_at > tenant.updated_at and updated.created_at == tenant.created_at
    assert service.get_tenant(tenant.id) == updated
    assert service.update_tenant(tenant.id) == updated  # nothing to change


def test_update_refuses_bad_values_and_unknown_tenant(service):
    tenant = service.create_tenant("acme")
    with pytest.raises(InvalidTenantField, match="limits.bogus"):
        service.update_tenant(tenant.id, limits={"bogus": 1})
    with pytest.raises(InvalidTenantField, match="status"):
        service.update_tenant(tenant.id, status="deleted")
    with pytest.raises(UnknownTenant) as e:
        service.update_tenant("ten_missing", plan="pro")
    assert e.value.status == 404
    assert service.get_tenant(tenant.id) == tenant


def test_an_unknown_limit_gets_the_closest_valid_name_and_the_valid_ones(service):
    # Issue 46: a typo names the field it refused and what to write instead.
    tenant = service.create_tenant("acme")
    with pytest.raises(InvalidTenantField) as e:
        service.update_tenant(tenant.id, limits={"request_per_minute": 60})
    assert e.value.status == 400 and "did you mean `requests_per_minute`?" in e.value.message
    assert "valid fields: requests_per_minute, tokens_per_minute," in e.value.message
    with pytest.raises(InvalidTenantField) as e:  # on create, and per base model (BaseLimits' fields)
        service.create_tenant("globex", limits={"models": {"tiny": {"tokens_per_minut": 5}}})
    assert e.value.message.startswith("limits.models.tiny.tokens_per_minut")
    assert "did you mean `tokens_per_minute`?" in e.value.message and "max_n" not in e.value.message
    with pytest.raises(InvalidTenantField) as e:  # nothing close: the valid names alone
        service.update_tenant(tenant.id, limits={"zzz": 1})
    assert "did you mean" not in e.value.message and "max_sequences_per_request" in e.value.message


def test_key_is_shown_once_and_stored_only_as_sha256(service, db_url):
    tenant = service.create_tenant("acme")
    record, key = service.issue_key(tenant.id)
    assert key.startswith("lpx-") and len(key) > 40
    assert record.id.startswith("key_") and key.startswith(record.prefix) and len(record.prefix) < len(key) // 3
    with service.engine.connect() as conn:
        row = conn.execute(select(api_keys)).one()
    assert row.key_hash == hashlib.sha256(key.encode()).hexdigest()
    assert key not in {str(v) for v in row}
    assert "key" not in record.to_json() and service.list_keys(tenant.id) == [record]


def test_authenticate_returns_principal(service):
    tenant = service.create_tenant("acme", plan="pro", limits=LIMITS)
    record, key = service.issue_key(tenant.id)
    principal = service.authenticate(key)
    assert (principal.tenant_id, principal.tenant_name, principal.plan, principal.key_id) == \
        (tenant.id, "acme", "pro", record.id)
    assert principal.limits.model_dump() == LIMITS


@pytest.mark.parametrize("bearer", [None, "", "lpx-wrong", "not-our-scheme", "lpx-" + "a" * 1000])
def test_missing_or_invalid_key_is_401(service, bearer):
    tenant = service.create_tenant("acme")
    service.issue_key(tenant.id)
    with pytest.raises(InvalidAPIKey) as e:
        service.authenticate(bearer)
    assert e.value.status == 401


def test_authenticate_compares_in_constant_time(service):
    _, key = service.issue_key(service.create_tenant("acme").id)
    with mock.patch("loraplex.tenancy.keys.hmac.compare_digest", wraps=key_material.hmac.compare_digest) as cd:
        service.authenticate(key)
    assert cd.called
    assert key_material.key_matches(key, key_material.hash_key(key))
    assert not key_material.key_matches(key + "x", key_material.hash_key(key))


def test_revoke_takes_effect_on_next_call_and_is_idempotent(service):
    tenant = service.create_tenant("acme")
    record, key = service.issue_key(tenant.id)
    _, other_key = service.issue_key(tenant.id)
    service.authenticate(key)
    revoked = service.revoke_key(record.id)
    assert revoked.revoked and revoked.revoked_at is not None
    with pytest.raises(InvalidAPIKey, match="revoked"):
        service.authenticate(key)
    assert service.authenticate(other_key).tenant_id == tenant.id  # other keys unaffected
    assert service.revoke_key(record.id).revoked_at == revoked.revoked_at
    with pytest.raises(UnknownKey):
        service.revoke_key("key_missing")


def test_suspend_is_403_and_reactivate_restores(service):
    tenant = service.create_tenant("acme")
    _, key = service.issue_key(tenant.id)
    assert service.update_tenant(tenant.id, status="suspended").status == "suspended"
    with pytest.raises(TenantSuspended) as e:
        service.authenticate(key)
    assert e.value.status == 403 and "acme" in e.value.message
    service.update_tenant(tenant.id, status="active")
    assert service.authenticate(key).tenant_id == tenant.id


def test_keys_of_unknown_tenant_are_404(service):
    with pytest.raises(UnknownTenant):
        service.issue_key("ten_missing")
    with pytest.raises(UnknownTenant):
        service.list_keys("ten_missing")


def test_state_is_shared_between_services_without_cache(db_url):
    # Two ingress replicas: a revocation through one holds at once on the other.
    engine_a, engine_b = make_engine(db_url), make_engine(db_url)
    try:
        a, b = TenantService(engine_a), TenantService(engine_b)
        record, key = a.issue_key(a.create_tenant("acme").id)
        assert b.authenticate(key).key_id == record.id
        a.revoke_key(record.id)
        with pytest.raises(InvalidAPIKey):
            b.authenticate(key)
    finally:
        engine_a.dispose()
        engine_b.dispose()


def test_migration_is_registered_and_idempotent(service):
    assert applied_versions(service.engine)["tenancy"] == {1}
    TenantService(service.engine)  # a second replica starting: no error, no new version
    assert applied_versions(service.engine)["tenancy"] == {1}


def test_concurrent_creates_of_one_name_yield_one_tenant(service):
    results: list = []

    def create():
        try:
            results.append(service.create_tenant("race"))
        except DuplicateTenantName as e:
            results.append(e)

    threads = [threading.Thread(target=create) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(not isinstance(r, Exception) for r in results) == 1
    assert len(service.list_tenants()) == 1


def test_admin_token_env_wins_over_config_and_empty_is_unset(monkeypatch):
    monkeypatch.delenv("LORAPLEX_ADMIN_TOKEN", raising=False)
    assert TenancyConfig().resolved_admin_token() is None
    assert TenancyConfig(admin_token="").resolved_admin_token() is None
    assert TenancyConfig(admin_token="cfg").resolved_admin_token() == "cfg"
    monkeypatch.setenv("LORAPLEX_ADMIN_TOKEN", "env")
    assert TenancyConfig(admin_token="cfg").resolved_admin_token() == "env"
