"""Errors the tenant service raises; each carries the HTTP status the ingress answers with.

Messages name the problem and the fix: the ingress shows them to the caller verbatim.
"""

from __future__ import annotations


class TenancyError(Exception):
    status = 400

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class InvalidTenantField(TenancyError):
    status = 400


class UnknownTenant(TenancyError):
    status = 404


class UnknownKey(TenancyError):
    status = 404


class DuplicateTenantName(TenancyError):
    status = 409


class InvalidAPIKey(TenancyError):
    """Missing, unknown or revoked key (401)."""

    status = 401


class TenantSuspended(TenancyError):
    status = 403
