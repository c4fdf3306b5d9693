"""The runner waits what a refusal's Retry-After asks before sending its lines again, within bounds."""

from loraplex.batches.config import BatchConfig
from loraplex.batches.runner import MAX_RETRY_WAIT_S, BatchRunner


def runner(retry_s=2.0):
    return BatchRunner(repo=None, files=None, config=BatchConfig(retry_s=retry_s), execute=None, owner="t")


def test_the_soonest_retry_after_is_waited_never_less_than_retry_s():
    r = runner(retry_s=2.0)
    assert r._retry_wait([None, None]) == 2.0  # no hint: retry_s
    assert r._retry_wait([7.0, None, 5.0]) == 5.0  # the soonest line may go then
    assert r._retry_wait([1.0]) == 2.0  # never sooner than retry_s
    assert r._retry_wait([3600.0]) == MAX_RETRY_WAIT_S  # a cancel is looked at after the wait
