"""StatusError: the one base of every error that answers with an HTTP status.

Components raise their own subclasses (an unknown tenant, a bad archive, a missing adapter...);
the ingress renders any of them with `body()`, OpenAI's error shape. Messages name the problem
and the fix: callers read them verbatim. It imports only loraplex.contract (the error body's shape), so every component can import it.
"""

from __future__ import annotations

from typing import Any, Optional

from loraplex.contract import ERROR_TYPES, error_body  # noqa: F401  (ERROR_TYPES: re-exported)


class StatusError(Exception):
    """An error with the HTTP status, OpenAI error fields and headers its answer carries.

    Subclasses set `status` (and may set `headers`); `status=` overrides it per instance.
    `code` defaults to the status; `param` names the request field at fault.
    """

    status: int = 500
    headers: dict[str, str] = {}

    def __init__(self, message: str, *, status: Optional[int] = None, param: Optional[str] = None,
                 type: Optional[str] = None, code: Any = None, headers: Optional[dict[str, str]] = None,
                 reject_reason: Optional[str] = None):
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status
        self.param = param
        self.type = type or ERROR_TYPES.get(
            self.status, "server_error" if self.status >= 500 else "invalid_request_error")
        self.code = self.status if code is None else code
        self.headers = dict(self.__class__.headers if headers is None else headers)
        # The ledger's and the metrics' word for this refusal (`429:<code>`, `503:shed`); None:
        # the status alone (`refusal_reason`).
        self.reject_reason = reject_reason

    @property
    def refusal_reason(self) -> str:
        """How this error is counted when it refuses a request."""
        return self.reject_reason or str(self.status)

    def body(self) -> dict[str, Any]:
        """OpenAI's error body: {"error": {"message", "type", "param", "code"}}."""
        return error_body(self.message, self.status, type=self.type, param=self.param, code=self.code)

    def with_param(self, param: str) -> "StatusError":
        """Name the request field at fault, unless the raiser already did; returns self."""
        if self.param is None:
            self.param = param
        return self
