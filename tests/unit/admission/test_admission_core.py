"""The limiter's pure logic: buckets, slots, budgets, Retry-After (no Ray, no I/O)."""

from datetime import datetime, timezone

import pytest

from loraplex.admission.core import LimiterCore, Refusal, TokenBucket, next_month_start, retry_after_s

WALL = datetime(2026, 11, 30, 23, 59, 0, tzinfo=timezone.utc).timestamp()


def test_retry_after_is_whole_seconds_at_least_one():
    assert retry_after_s(0, 1) == 1
    assert retry_after_s(-5, 1) == 1
    assert retry_after_s(0.01, 1) == 1
    assert retry_after_s(1, 1) == 1
    assert retry_after_s(1.01, 1) == 2
    assert retry_after_s(1, 3 / 60) == 20  # 3 per minute: one every 20 s
    assert retry_after_s(3, 0.05) == 60


def test_bucket_refills_at_capacity_per_minute_and_caps():
    b = TokenBucket(60, now=0)
    b.take(60)
    assert b.available(0) == 0
    assert b.available(10) == pytest.approx(10)
    assert b.available(1000) == 60
    b.give(100, 1000)
    assert b.level == 60


def test_bucket_resize_keeps_what_the_window_used():
    b = TokenBucket(10, now=0)
    b.take(8)
    b.resize(100, 0)
    assert b.available(0) == 92
    b.resize(5, 0)  # lowered under what was used: wait until it refills
    assert b.available(0) == -3


def grant(core, tenant, limits, need, want=None, now=0.0, holder="a"):
    return core.acquire(tenant, holder, limits, need, want or need, now, WALL)


def test_requests_bucket_refuses_with_retry_after_and_admits_again():
    core = LimiterCore()
    limits = {"requests": 3}
    for _ in range(3):
        assert "granted" in grant(core, "t", limits, {"requests": 1})
    r = grant(core, "t", limits, {"requests": 1}, now=1.0)
    assert isinstance(r, Refusal) and r.code == "rate_limit_requests"
    assert r.retry_after == 19  # 1 s of 20 s refilled
    assert isinstance(grant(core, "t", limits, {"requests": 1}, now=1.0 + 18.5), Refusal)
    assert "granted" in grant(core, "t", limits, {"requests": 1}, now=1.0 + r.retry_after)


def test_tokens_bucket_names_the_limit_and_a_too_big_request_waits_a_window():
    core = LimiterCore()
    assert "granted" in grant(core, "t", {"tokens": 100}, {"tokens": 70})
    r = grant(core, "t", {"tokens": 100}, {"tokens": 70})
    assert r.code == "rate_limit_tokens" and r.retry_after == 24  # 40 missing at 100/60 per s
    r = grant(core, "t", {"tokens": 100}, {"tokens": 500}, now=1000)
    assert r.code == "rate_limit_tokens" and r.retry_after == 60 and "max_tokens" in r.message


def test_grant_is_all_or_nothing_and_at_most_what_is_there():
    core = LimiterCore()
    limits = {"requests": 10, "tokens": 100}
    assert grant(core, "t", limits, {"requests": 1, "tokens": 10}, {"requests": 4, "tokens": 1000})["granted"] == \
        {"requests": 4, "tokens": 100}
    r = grant(core, "t", limits, {"requests": 1, "tokens": 10})
    assert r.code == "rate_limit_tokens"
    assert core.tenants["t"].buckets["requests"].level == 6  # the refusal took nothing


def test_concurrency_slots_per_holder_given_back_and_expired():
    core = LimiterCore(holder_ttl_s=30)
    limits = {"concurrency": 2}
    g = grant(core, "t", limits, {"concurrency": 1}, holder="a")
    grant(core, "t", limits, {"concurrency": 1}, holder="b")
    r = grant(core, "t", limits, {"concurrency": 1}, holder="a")
    assert r.code == "concurrency_limit" and r.retry_after == 1
    core.give_back("t", "a", g["epoch"], {"concurrency": 1}, [], 1.0, WALL)
    assert "granted" in grant(core, "t", limits, {"concurrency": 1}, now=1.0, holder="a")
    # b dies holding its slot: once silent for holder_ttl_s, its slot is free again
    core.touch("a", 40.0)
    assert isinstance(grant(core, "t", limits, {"concurrency": 1}, now=20.0, holder="a"), Refusal)
    assert "granted" in grant(core, "t", limits, {"concurrency": 1}, now=40.0, holder="a")


def test_give_back_from_a_lost_state_is_ignored():
    core = LimiterCore()
    grant(core, "t", {"concurrency": 1}, {"concurrency": 1})
    core.give_back("t", "a", "another-epoch", {"concurrency": 1}, [], 0, WALL)
    assert core.tenants["t"].slots.total() == 1


def test_budget_counts_ledger_unsettled_and_in_flight_and_waits_for_next_month():
    core = LimiterCore()
    month = datetime(2026, 11, 1, tzinfo=timezone.utc)
    core.set_settled("t", month, 900, set(), 0, 1000)
    limits = {"budget": 1000}
    g = grant(core, "t", limits, {"budget": 60})
    r = grant(core, "t", limits, {"budget": 60})
    assert r.code == "budget_exceeded" and r.retry_after == 1  # only the one in flight blocks it
    # it ends having used 50: the ledger does not have it yet, the limiter still counts it
    core.give_back("t", "a", g["epoch"], {"budget": 10}, [("req-1", 50)], 0, WALL)
    r = grant(core, "t", limits, {"budget": 60})
    assert r.code == "budget_exceeded" and r.retry_after == 60  # 950 + 60 > 1000: next month
    assert next_month_start(WALL) - WALL == 60
    assert "granted" in grant(core, "t", limits, {"budget": 50})
    # the ledger's next read has req-1: it is counted there, not twice
    core.set_settled("t", month, 950, {"req-1"}, 1, 1000)
    assert core.tenants["t"].budget.used() == 1000


def test_patch_of_limits_takes_effect_on_the_next_acquire():
    core = LimiterCore()
    grant(core, "t", {"requests": 1}, {"requests": 1})
    assert isinstance(grant(core, "t", {"requests": 1}, {"requests": 1}), Refusal)
    assert "granted" in grant(core, "t", {"requests": 1000}, {"requests": 1})
    assert "granted" in grant(core, "t", {}, {})  # limit cleared
