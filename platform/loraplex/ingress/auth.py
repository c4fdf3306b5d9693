"""Bearer authentication for tenant and admin routes."""

from __future__ import annotations

import hashlib
import hmac
from typing import Optional

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request

from loraplex.ingress.errors import APIError
from loraplex.tenancy.config import ADMIN_TOKEN_ENV
from loraplex.tenancy.models import Principal
from loraplex.tenancy.service import WWW_AUTHENTICATE
from loraplex.tenancy.tenancy import Tenancy


async def authenticate(request: Request, tenancy: Tenancy) -> Principal:
    """The caller's tenant from `Authorization: Bearer <key>`; InvalidAPIKey 401 (missing, invalid
    or revoked key, with WWW-Authenticate: Bearer), TenantSuspended 403, or StoreUnavailable 503
    (database down and the key not verified within the cache's ttl_s) otherwise.

    A key verified less than `tenancy.key_cache.refresh_s` ago is a dict lookup on the event
    loop (the revocation bound; see loraplex/tenancy/key_cache.py); else one query in a thread."""
    token = bearer_token(request)
    principal = tenancy.keys.cached(token)
    if principal is None:
        principal = await run_in_threadpool(tenancy.keys.verify, token)
    return principal


def bearer_token(request: Request) -> Optional[str]:
    """The token of an `Authorization: Bearer <token>` header (scheme case-insensitive), else None."""
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


def check_admin(request: Request, tenancy: Tenancy) -> None:
    """APIError unless the request carries the admin token: 503 when none is configured (the
    admin API is never open by default), 401 for a missing or wrong one."""
    expected = tenancy.admin_token
    if not expected:
        # No Retry-After: waiting will not help, only configuration will.
        raise APIError(503, f"The admin API is disabled because no admin token is configured: set the "
                            f"{ADMIN_TOKEN_ENV} env var (or tenancy.admin_token in the config) for the "
                            "ingress and restart it.")
    token = bearer_token(request)
    if token is None:
        raise APIError(401, "Missing admin token: send `Authorization: Bearer <admin token>` "
                            f"(the value of {ADMIN_TOKEN_ENV}).", headers=WWW_AUTHENTICATE)
    # Compare digests, not the tokens: equal lengths, so not even the token's length leaks.
    if not hmac.compare_digest(_digest(token), _digest(expected)):
        raise APIError(401, f"Invalid admin token: use the value of {ADMIN_TOKEN_ENV} that the ingress "
                            "was started with (a tenant API key is not an admin token).",
                       headers=WWW_AUTHENTICATE)


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8")).digest()
