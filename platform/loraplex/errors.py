"""StatusError: the one base of every error that answers with an HTTP status.

Components raise their own subclasses (an unknown tenant, a bad archive, a missing adapter...);
the ingress renders any of them with `body()`, OpenAI's error shape. Messages name the problem
and the fix: callers read them verbatim. Dependency-free, so every component can import it.
"""

from __future__ import annotations

from typing import Any, Optional

# OpenAI's error `type` per status; others: server_error (5xx) or invalid_request_error.
ERROR_TYPES = {
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


class StatusError(Exception):
    """An error with the HTTP status, OpenAI error fields and headers its answer carries.

    Subclasses set `status` (and may set `headers`); `status=` overrides it per instance.
    `code` defaults to the status; `param` names the request field at fault.
    """

    status: int = 500
    headers: dict[str, str] = {}

    def __init__(self, message: str, *, status: Optional[int] = None, param: Optional[str] = None,
                 type: Optional[str] = None, code: Any = None, headers: Optional[dict[str, str]] = None):
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status
        self.param = param
        self.type = type or ERROR_TYPES.get(
            self.status, "server_error" if self.status >= 500 else "invalid_request_error")
        self.code = self.status if code is None else code
        self.headers = dict(self.__class__.headers if headers is None else headers)

    def body(self) -> dict[str, Any]:
        """OpenAI's error body: {"error": {"message", "type", "param", "code"}}."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def with_param(self, param: str) -> "StatusError":
        """Name the request field at fault, unless the raiser already did; returns self."""
        if self.param is None:
            self.param = param
        return self
