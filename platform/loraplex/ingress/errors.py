"""The ingress's errors: `APIError(status, message)` for checks made in a route, and the one
rendering of any `StatusError` (the ingress's own or a component's) as an OpenAI error body."""

from __future__ import annotations

from typing import Optional

from starlette.responses import JSONResponse

from loraplex.errors import StatusError


class APIError(StatusError):
    """Raised anywhere in a route; rendered as an OpenAI error body with this status."""

    def __init__(self, status: int, message: str, param: Optional[str] = None, type: Optional[str] = None,
                 headers: Optional[dict[str, str]] = None, reject_reason: Optional[str] = None, code=None):
        super().__init__(message, status=status, param=param, type=type, headers=headers,
                         reject_reason=reject_reason, code=code)


def error_response(exc: StatusError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)
