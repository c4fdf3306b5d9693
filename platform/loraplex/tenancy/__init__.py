"""Tenants, their API keys and limits; authentication of bearer keys.

config.py (the admin token), models.py (limits, tenants, keys, principal, request bodies and
their tables), keys.py (API key material), service.py (TenantService, its errors, Tenancy).
"""
from loraplex.tenancy.config import ADMIN_TOKEN_ENV, TenancyConfig
from loraplex.tenancy.models import (
    DEFAULT_PLAN, MIGRATIONS, ApiKey, Principal, Tenant, TenantCreate, TenantLimits, TenantUpdate,
)
from loraplex.tenancy.service import (
    WWW_AUTHENTICATE, DuplicateTenantName, InvalidAPIKey, InvalidTenantField, Tenancy, TenantService,
    TenantSuspended, UnknownKey, UnknownTenant,
)

__all__ = [
    "ADMIN_TOKEN_ENV", "ApiKey", "DEFAULT_PLAN", "DuplicateTenantName", "InvalidAPIKey", "InvalidTenantField",
    "MIGRATIONS", "Principal", "Tenancy", "TenancyConfig", "Tenant", "TenantCreate", "TenantLimits",
    "TenantService", "TenantSuspended", "TenantUpdate", "UnknownKey", "UnknownTenant", "WWW_AUTHENTICATE",
]
