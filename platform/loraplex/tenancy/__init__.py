"""Tenants, their API keys and limits; authentication of bearer keys."""
from loraplex.tenancy.config import ADMIN_TOKEN_ENV, TenancyConfig
from loraplex.tenancy.errors import (
    DuplicateTenantName, InvalidAPIKey, InvalidTenantField, TenancyError, TenantSuspended, UnknownKey, UnknownTenant,
)
from loraplex.tenancy.limits import TenantLimits
from loraplex.tenancy.principal import Principal
from loraplex.tenancy.records import ApiKey, Tenant
from loraplex.tenancy.requests import TenantCreate, TenantUpdate
from loraplex.tenancy.service import TenantService
from loraplex.tenancy.tables import MIGRATIONS
from loraplex.tenancy.tenancy import Tenancy

__all__ = [
    "ADMIN_TOKEN_ENV", "ApiKey", "DuplicateTenantName", "InvalidAPIKey", "InvalidTenantField", "MIGRATIONS",
    "Principal", "Tenancy", "TenancyConfig", "TenancyError", "Tenant", "TenantCreate", "TenantLimits",
    "TenantService", "TenantSuspended", "TenantUpdate", "UnknownKey", "UnknownTenant",
]
