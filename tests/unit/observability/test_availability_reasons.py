"""Which refusals count against the availability objective (observability/promql.py: failed + the
refusals whose reason matches names.SHED_REASONS): those of the platform's own stores and disks
failing are our unavailability; a tenant's own limit is not. The reasons are taken from the errors
the platform raises, so renaming one, or narrowing SHED_REASONS to the overload reasons, fails here."""

import re

import pytest

from loraplex.admission.limiter import LimitExceeded
from loraplex.db.unavailable import StoreUnavailable
from loraplex.disk_full import CacheDiskFull, UploadTempFull
from loraplex.observability import names as n
from loraplex.store_io import AdapterStoreUnavailable

FULL = OSError(28, "No space left on device")

PLATFORM_FAILURES = {
    "adapter store down": AdapterStoreUnavailable("s3://b/p", "this version could not be loaded", timeout_s=5),
    "adapter cache full": CacheDiskFull("/var/cache", FULL),
    "upload temp full": UploadTempFull("/tmp", FULL),
    "database down": StoreUnavailable("POST /v1/chat/completions cannot be answered now"),
}


@pytest.mark.parametrize("name", PLATFORM_FAILURES)
def test_a_refusal_for_a_store_of_ours_failing_counts_against_availability(name):
    assert re.fullmatch(n.SHED_REASONS, PLATFORM_FAILURES[name].refusal_reason)


def test_a_full_usage_spool_counts_against_availability():
    # The Engine replica's refusal reaches the ingress as `<status>:<reason>` (ingress/openai_routes.py).
    assert re.fullmatch(n.SHED_REASONS, "503:usage_spool_full")


def test_a_tenants_own_limit_does_not():
    assert not re.fullmatch(n.SHED_REASONS, LimitExceeded("rate_limit_requests", 1, "slow down").refusal_reason)
