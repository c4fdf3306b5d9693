"""Tenants, their API keys and limits; authentication of bearer keys.

config.py (the admin token), models.py (limits, tenants, keys, principal, request bodies and
their tables), keys.py (API key material), service.py (TenantService, its errors),
key_cache.py (the keys an ingress replica verified), tenancy.py (Tenancy: what the ingress holds).

Import the module you need: this file imports nothing, so loading one piece (the config) does
not load the rest (the ledger, SQLAlchemy).
"""
