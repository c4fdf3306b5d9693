"""OpenAI-style error bodies: {"error": {"message", "type", "param", "code"}}."""

from __future__ import annotations

from typing import Optional

from starlette.responses import JSONResponse

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "conflict_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    503: "service_unavailable",
    504: "timeout_error",
}


class APIError(Exception):
    """Raised anywhere in a route; rendered as an OpenAI error body with this status."""

    def __init__(
        self,
        status: int,
        message: str,
        param: Optional[str] = None,
        type: Optional[str] = None,
        headers: Optional[dict[str, str]] = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.type = type or _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
        self.headers = headers or {}

    def response(self) -> JSONResponse:
        return error_response(self.status, self.message, self.param, self.type, self.headers)


def error_response(
    status: int,
    message: str,
    param: Optional[str] = None,
    type: Optional[str] = None,
    headers: Optional[dict[str, str]] = None,
) -> JSONResponse:
    body = {
        "error": {
            "message": message,
            "type": type or _TYPES.get(status, "server_error"),
            "param": param,
            "code": status,
        }
    }
    return JSONResponse(body, status_code=status, headers=headers)
