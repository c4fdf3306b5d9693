"""GenerationBound: at most `limit` generation requests in one ingress replica at once; one more
is refused at once (503 + Retry-After, counted as the refusal `503:ingress_busy`) instead of waiting.

Why our own bound and not Ray Serve's `max_ongoing_requests`: a replica at Serve's bound makes
the HTTP proxy hold the next requests and retry the replica with backoff, and Ray Serve 2.60's
proxy router then stays in its 0.5 s backoff long after the replica has emptied: measured with
scripts/bench_ingress.py at 400 requests/s offered, 0 requests in the Ingress replica and
thousands waiting in the proxy, 4 routed per second for 44 s (docs/benchmarks.md, issue 21).
So the Ingress deployment's Serve bound is `serve_max_ongoing_requests(limit)`, far above this
one, and never reached: a request past this bound costs a counter check and a small reply, and
the requests already admitted keep their latency (goodput stays at the replica's capacity).

Only generation routes count (each holds the replica's event loop for its whole stream); health,
admin and usage routes are never refused here, so /readyz still answers under overload.
"""

from __future__ import annotations

from typing import Callable, Optional

from loraplex.errors import StatusError
from loraplex.ingress.errors import error_response

REASON = "503:ingress_busy"  # the ledger's and the metrics' word for this refusal
# What Serve's bound adds to ours: refusals still pass through Serve for the ms they take (under
# a heavy overload, hundreds at once), plus every non-generation route.
SERVE_HEADROOM = 1024


def serve_max_ongoing_requests(limit: int) -> int:
    """The Ingress deployment's Serve `max_ongoing_requests` for a GenerationBound of `limit`."""
    return limit + SERVE_HEADROOM


class IngressBusy(StatusError):
    status = 503

    def __init__(self, limit: int):
        super().__init__(f"The server is overloaded ({limit} requests in progress on this ingress replica); "
                         "retry in a moment.", code="ingress_busy", headers={"Retry-After": "1"},
                         reject_reason=REASON)


class GenerationBound:
    """ASGI middleware: counts the requests in progress on `paths` (the generation routes, from
    arrival to the end of their response, streams included, however they end) and refuses those
    past `limit`. `on_refused(reason)`: counts a refusal (the ledger's and the metrics' counters)."""

    def __init__(self, app, limit: int, paths: frozenset[str],
                 on_refused: Optional[Callable[[str], None]] = None):
        self.app = app
        self.limit = limit
        self.on_refused = on_refused
        self.paths = paths
        self.in_flight = 0
        self.refused = 0

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["path"] not in self.paths:
            await self.app(scope, receive, send)
            return
        if self.in_flight >= self.limit:
            self.refused += 1
            if self.on_refused is not None:
                self.on_refused(REASON)
            await error_response(IngressBusy(self.limit))(scope, receive, send)
            return
        self.in_flight += 1  # one event loop: no lock needed
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1
