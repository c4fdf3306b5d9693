"""When the database cannot be reached: the one mapping from SQLAlchemy's errors to a 503.

`is_unavailable(exc)` says whether an exception means "the database is not there right now"
(refused or timed-out connection, a connection that broke mid-query, a pool with no connection
to give) rather than a bug or a constraint; `StoreUnavailable` is the 503 + Retry-After an API
caller gets for it. The ingress maps every such exception raised by any route to it (its
exception handlers), and the code paths that can do better than refuse (cached keys, last-known
adapter resolutions) catch it themselves.
"""

from __future__ import annotations

from sqlalchemy import exc as sa

from loraplex.errors import StatusError

RETRY_AFTER_S = 5  # a failover or restart of PostgreSQL takes seconds to a minute

# A connection refused or timed out, or broken (OperationalError: psycopg's and sqlite3's
# connection errors, "terminating connection due to administrator command", "database is
# locked"); the driver's own interface broke (InterfaceError); QueuePool had no connection to
# give within pool_timeout (sa.TimeoutError); pool_pre_ping's reconnect failed (DisconnectionError).
UNAVAILABLE = (sa.OperationalError, sa.InterfaceError, sa.TimeoutError, sa.DisconnectionError)


def is_pool_exhausted(exc: BaseException) -> bool:
    """QueuePool had no connection to give within pool_timeout: the database is up and busy (every
    connection in use), not gone; answered 503 StoreBusy, never taken for an outage."""
    return isinstance(exc, sa.TimeoutError)


def is_unavailable(exc: BaseException) -> bool:
    if isinstance(exc, UNAVAILABLE):
        return True
    # Any other DBAPI error on a connection SQLAlchemy found dead (and invalidated).
    return isinstance(exc, sa.DBAPIError) and bool(exc.connection_invalidated)


class StoreUnavailable(StatusError):
    """503 + Retry-After: the database (tenants, adapters' catalog, usage) cannot be reached."""

    status = 503

    def __init__(self, what: str, cause: BaseException | None = None, retry_after_s: int = RETRY_AFTER_S):
        why = f" ({type(cause).__name__})" if cause is not None else ""
        super().__init__(
            f"The platform's database is unavailable{why}, so {what}. Retry in {retry_after_s} s; inference "
            "for keys this server has verified keeps working meanwhile.",
            code="store_unavailable", headers={"Retry-After": str(retry_after_s)},
            reject_reason="503:store_unavailable")


def unavailable(exc: BaseException, what: str) -> StoreUnavailable:
    """The 503 for `exc` (is_unavailable(exc) is true), saying what could not be done."""
    return StoreUnavailable(what, exc)


class StoreBusy(StatusError):
    """503 + Retry-After: every database connection of this replica is in use (the pool is exhausted)."""

    status = 503

    def __init__(self, what: str, retry_after_s: int = 1):
        super().__init__(
            f"The platform's database connections are all busy, so {what}. Retry in {retry_after_s} s.",
            code="store_busy", headers={"Retry-After": str(retry_after_s)}, reject_reason="503:store_busy")
