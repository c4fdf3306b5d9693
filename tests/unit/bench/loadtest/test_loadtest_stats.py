"""A level's summary, SLO capacity search, replicas and cost via the cost model."""
from decimal import Decimal

import pytest

from bench.loadtest.stats import SLO, capacity, cost_summary, replicas_needed, summarize
from loraplex.accounting.cost_model import per_million


def req(i, start, ttft, end, prompt=10, completion=11, status="ok", epoch=1_000_000.0):
    first = None if ttft is None else start + ttft
    return {"index": i, "status": status, "start": start, "end": end, "e2e": end - start, "ttft": ttft,
            "tpot": None if ttft is None or completion < 2 else (end - first) / (completion - 1),
            "prompt_tokens": prompt, "completion_tokens": completion,
            "start_epoch": epoch + start, "first_token_epoch": None if first is None else epoch + first,
            "end_epoch": epoch + end}


def test_summarize_a_level():
    rs = [req(0, 0.0, 0.5, 1.5), req(1, 0.0, 1.0, 2.0), req(2, 1.5, 0.5, 4.0),
          req(3, 2.0, None, 2.1, status="http_429", prompt=None, completion=None)]
    s = summarize(rs, 2, window_s=1.0)
    assert (s["requests"], s["ok"], s["failed"], s["error_rate"]) == (4, 3, 1, 0.25)
    assert s["statuses"] == {"ok": 3, "http_429": 1}
    assert s["duration_s"] == 4.0
    assert s["requests_per_s"] == 0.75 and s["output_tokens_per_s"] == 33 / 4 and s["total_tokens_per_s"] == 63 / 4
    assert s["ttft_p50"] == 0.5 and s["e2e_p50"] == 2.0
    assert s["tpot_p50"] == pytest.approx(0.1)  # (1.5 - 0.5) / 10
    assert s["mean_in_flight"] == pytest.approx((1.5 + 2.0 + 2.5) / 4)
    assert 0 < s["utilization"] <= 1 and s["peak_tokens_per_s"] > s["total_tokens_per_s"] * 0.99


def level(c, ttft95, tpot95, failed=0, tok_s=100.0, util=0.8):
    return {"level": c, "requests": 10, "ok": 10 - failed, "failed": failed, "error_rate": failed / 10,
            "ttft_p95": ttft95, "tpot_p95": tpot95, "peak_tokens_per_s": tok_s / util, "utilization": util,
            "total_tokens_per_s": tok_s, "mean_in_flight": c}


def test_slo_check_names_each_miss():
    slo = SLO(ttft_p95_s=1.0, tpot_p95_s=0.05)
    assert slo.check(level(1, 0.9, 0.04)) == (True, [])
    met, why = slo.check(level(1, 1.2, 0.06, failed=1))
    assert not met and len(why) == 3 and "TTFT" in why[1] and "TPOT" in why[2]
    assert SLO(None, None).check(level(1, 99, 99)) == (True, [])
    assert SLO(1, 1).check({**level(1, 0.1, 0.1), "ok": 0}) == (False, ["no successful request"])


def test_capacity_is_the_highest_level_with_every_lower_one_meeting():
    slo = SLO(ttft_p95_s=1.0, tpot_p95_s=0.05)
    levels = [level(8, 1.5, 0.04), level(1, 0.2, 0.01), level(4, 0.8, 0.04), level(2, 0.3, 0.02),
              level(16, 0.9, 0.04)]  # 16 passes after 8 failed: noise
    cap = capacity(levels, slo)
    assert cap["capacity"] == 4 and cap["at"]["level"] == 4
    assert not cap["all_met"] and cap["met_above_first_miss"] == [16]
    assert capacity([level(1, 2.0, 0.01), level(2, 0.5, 0.01)], slo)["capacity"] is None
    every = capacity([level(1, 0.1, 0.01), level(2, 0.1, 0.01)], slo)
    assert every["capacity"] == 2 and every["all_met"]
    assert capacity([], slo)["capacity"] is None


def test_replicas_needed():
    assert replicas_needed(100, 16) == 7
    assert replicas_needed(16, 16) == 1
    assert replicas_needed(1, 16) == 1
    assert replicas_needed(None, 16) is None and replicas_needed(10, None) is None


def test_cost_summary_goes_through_the_cost_model():
    at = level(8, 0.5, 0.01, tok_s=100.0, util=0.8)  # peak 125 tok/s, average 100
    c = cost_summary(at, Decimal("3.60"), 1, peak_concurrency=20, capacity_level=8)
    assert c["capacity_cost_per_1m"] == str(per_million(Decimal("3.60"), 1, 125.0, 1.0)) == "8.000000"
    # at the measured utilization: 3.60 / (100 tok/s x 3600) x 1e6
    assert c["measured_cost_per_1m"] == str(per_million(Decimal("3.60"), 1, 125.0, 0.8)) == "10.000000"
    # 20 at peak / 8 per replica -> 3 replicas, each at 20 / 24 of capacity
    assert c["replicas"] == 3 and c["fleet_utilization_at_peak"] == pytest.approx(20 / 24)
    assert c["fleet_cost_per_1m_at_peak"] == "12.000000"  # 3 x 3.60 / (100 x 20/8 x 3600) x 1e6
    assert "replicas" not in cost_summary(at, Decimal("1"), 1)
    given = cost_summary(at, Decimal("3.60"), 1, utilization=0.5)
    assert given["given_cost_per_1m"] == str(per_million(Decimal("3.60"), 1, 125.0, 0.5)) == "16.000000"
