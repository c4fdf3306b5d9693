"""bench/fairness.py's arithmetic: the max-min fair allocation, Jain's index, Zipf demand; variant names."""

import pytest

from bench import fairness as f
from bench.fairness import jain, max_min_fair, zipf_rates


def test_max_min_fair_fills_small_demands_and_splits_the_rest():
    assert max_min_fair([1, 2, 10], 9) == [1, 2, 6]
    assert max_min_fair([5, 5], 4) == [2, 2]
    assert max_min_fair([1, 1], 10) == [1, 1]  # more capacity than demand: everyone's demand


def test_jain_is_one_at_the_fair_allocation_and_falls_with_unfairness():
    fair = [1, 2, 6]
    assert jain(fair, fair) == pytest.approx(1.0)
    assert jain([0.5, 1, 3], fair) == pytest.approx(1.0)  # the same share each: still fair
    assert jain([1, 2, 0], fair) < 0.7


def test_zipf_rates_sum_to_the_total_and_fall_by_rank():
    rates = zipf_rates(20, 4.0)
    assert sum(rates) == pytest.approx(4.0)
    assert rates[0] == pytest.approx(2 * rates[1])


def test_served_before_counts_only_what_streamed_before_the_arrivals_ended():
    from bench.fairness import served_before, tenant_summary

    r = {"tenant": 0, "status": "ok", "http_status": 200, "e2e": 10.0, "ttft": 1.0, "prompt_tokens": 10,
         "completion_tokens": 100, "first_token_epoch": 100.0, "end_epoch": 110.0}
    assert served_before(r, 120.0) == 10 + 200  # all before: prompt + 2 x completion
    assert served_before(r, 105.0) == 10 + 100  # half the completion streamed by then
    assert served_before(r, 99.0) == 0  # its first token came after
    assert served_before(r, 105.0, 0, 1) == 50  # completion tokens only
    late = dict(r, first_token_epoch=130.0, end_epoch=140.0)
    s = tenant_summary([r, late], 0, 60.0, until_epoch=120.0)
    assert s["window_service"] == 210 and s["service"] == 420  # the drain's request left out


def test_a_variant_name_sets_the_queue_and_engine_it_runs():
    named = {"off": ({"enabled": False}, {}), "on": ({"enabled": True}, {}),
             "old": ({"dispatch_limit": 8}, {"tenant_scheduler": {"enabled": False}})}
    assert f.parse_variant("on", named) == ("on", {"enabled": True}, {}, {})
    assert f.parse_variant("off+tok256", named) == ("off", {"enabled": False}, {"max_num_batched_tokens": 256}, {})
    assert f.parse_variant("on@adaptive", named) == ("on@adaptive", {"enabled": True, "dispatch_limit": "adaptive"}, {}, {})
    assert f.parse_variant("old", named) == ("old", {"dispatch_limit": 8}, {"tenant_scheduler": {"enabled": False}}, {})
    assert f.parse_variant("on+sched0", named)[2] == {"tenant_scheduler": {"enabled": False}}
    assert f.parse_variant("on@8+pace0+tok512+mp1", named) == (
        "on@8", {"enabled": True, "dispatch_limit": 8, "max_prefilling_per_tenant": None},
        {"max_num_batched_tokens": 512}, {"VLLM_ENABLE_V1_MULTIPROCESSING": "1"})
    assert named["on"] == ({"enabled": True}, {})  # a suffix changes the variant's copy only
    f.parse_variant("on+pace1", named)
    assert named["on"] == ({"enabled": True}, {})
    with pytest.raises(SystemExit, match="unknown suffix"):
        f.parse_variant("on@8+fast", named)


def test_within_slo_counts_refused_and_failed_requests_as_misses():
    ok = {"tenant": 0, "status": "ok", "ttft": 1.0, "tpot": 0.1}
    rows = [ok, dict(ok, ttft=3.0), dict(ok, tpot=0.5), dict(ok, status="refused", ttft=None),
            dict(ok, status="cut"), dict(ok, tenant=1)]
    assert f.within_slo(rows, 0, 2.5, 0.3) == (1, 4)  # a cut request is neither


async def test_queue_cost_runs_the_engines_real_queue_glue():
    # It calls the Engine replica's private queue glue: a renamed or re-signed method breaks the
    # benchmark only at its end, after 25 minutes, unless this catches it first.
    cost = await f.queue_cost_us(requests=72, tenants=4)
    assert cost["requests"] == 72 and cost["on_us"] > 0
