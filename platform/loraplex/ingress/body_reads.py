"""BodyReads: per tenant, the request bodies an ingress replica is reading at once, bounded.

A tenant's slow bodies hold its own max_concurrent_requests slots (the limiter's hold, taken
before the body is read), but a tenant without that limit would still hold as many ingress
slots (GenerationBound) as it opens connections, each for up to ingress.body_timeout_s. An
honest client sends its body at once, so a handful being read per tenant is plenty; past
`limit` the next one is refused (429 + Retry-After) before it is read.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Optional

from loraplex.errors import StatusError

REASON = "429:body_reads"


class TooManyBodies(StatusError):
    status = 429

    def __init__(self, limit: int):
        super().__init__(f"Your tenant already has {limit} request bodies arriving on this ingress replica "
                         "(ingress.max_body_reads_per_tenant); send each body at once, then retry.",
                         code="body_reads", headers={"Retry-After": "1"}, reject_reason=REASON)


class BodyReads:
    def __init__(self, limit: Optional[int]):
        self.limit = limit  # None: unbounded
        self.reading: dict[str, int] = {}  # tenant -> bodies being read; one event loop, no lock

    @contextmanager
    def reading_for(self, tenant: str) -> Iterator[None]:
        n = self.reading.get(tenant, 0)
        if self.limit is not None and n >= self.limit:
            raise TooManyBodies(self.limit)
        self.reading[tenant] = n + 1
        try:
            yield
        finally:
            left = self.reading[tenant] - 1
            if left:
                self.reading[tenant] = left
            else:
                del self.reading[tenant]
