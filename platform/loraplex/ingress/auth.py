"""Bearer authentication for tenant routes, and running TenantService calls off the event loop."""

from __future__ import annotations

from typing import Any, Callable, Optional

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request

from loraplex.ingress.errors import APIError
from loraplex.tenancy import Principal, Tenancy, TenancyError

WWW_AUTHENTICATE = {"WWW-Authenticate": "Bearer"}


async def authenticate(request: Request, tenancy: Tenancy) -> Principal:
    """The caller's tenant from `Authorization: Bearer <key>`; APIError 401 (missing, invalid or
    revoked key, with WWW-Authenticate: Bearer) or 403 (suspended tenant) otherwise."""
    return await call_tenancy(tenancy.service.authenticate, bearer_token(request))


def bearer_token(request: Request) -> Optional[str]:
    """The token of an `Authorization: Bearer <token>` header (scheme case-insensitive), else None."""
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


async def call_tenancy(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run a (blocking, SQLAlchemy) TenantService method in a worker thread; its errors become
    OpenAI error responses with the status they carry."""
    try:
        return await run_in_threadpool(fn, *args, **kwargs)
    except TenancyError as e:
        raise APIError(e.status, e.message, headers=WWW_AUTHENTICATE if e.status == 401 else None) from e
