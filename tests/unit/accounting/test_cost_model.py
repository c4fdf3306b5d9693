from datetime import timedelta
from decimal import Decimal

from loraplex.accounting.config import PricingConfig
from loraplex.accounting.cost_model import cost_model_report
from loraplex.accounting.ledger import UsageLedger
from loraplex.accounting.pricing import PriceBook
from loraplex.accounting.cost_model import per_million
from usage_builders import T0, make_record


def test_formula():
    # 3.60/h x 2 GPUs / (100 tok/s x 0.5 x 3600) x 1e6 = 40
    assert per_million(Decimal("3.60"), 2, 100.0, 0.5) == Decimal("40.000000")
    assert per_million(Decimal("3.60"), 2, 0.0, 0.5) is None


def test_report_from_ledger(db_url, tmp_path):
    with UsageLedger(db_url, tmp_path / "spool") as ledger:
        # 1000 completion tokens over the first 10 s of a 100 s period; prompt lands at the first token.
        ledger.append(make_record(1, prompt_tokens=0, cached_prompt_tokens=0, completion_tokens=1000,
                                  first_token_time=T0, finish_time=T0 + timedelta(seconds=10)))
        ledger.flush()
        rep = cost_model_report(ledger.engine, T0, T0 + timedelta(seconds=100), gpu_hour_price=Decimal("3.60"),
                                gpus=2, window_s=10, prices=PriceBook.from_config(PricingConfig()))
    assert rep.requests == 1 and rep.tokens == 1000
    assert rep.peak_tokens_per_s == 100.0 and rep.avg_tokens_per_s == 10.0 and rep.utilization == 0.1
    assert rep.capacity_cost_per_1m == Decimal("20.000000")
    assert rep.real_cost_per_1m == Decimal("200.000000")
    assert rep.gpu_cost == Decimal("0.200000")  # = real cost x tokens / 1e6
    assert rep.revenue == Decimal("0.0015")  # 1000 output tokens at 1.50 / 1M
    assert "real_cost_per_1m" in rep.to_table()


def test_tokens_are_clipped_to_the_period(db_url, tmp_path):
    with UsageLedger(db_url, tmp_path / "spool") as ledger:
        # prompt 100 over [T0-1s, T0+1s): half falls before the period starts
        ledger.append(make_record(1, at=T0 - timedelta(seconds=1), prompt_tokens=100, cached_prompt_tokens=0,
                                  completion_tokens=0, first_token_time=T0 + timedelta(seconds=1),
                                  finish_time=T0 + timedelta(seconds=1)))
        ledger.flush()
        rep = cost_model_report(ledger.engine, T0, T0 + timedelta(seconds=10), gpu_hour_price=Decimal(1))
    assert rep.tokens == 50


def test_measured_throughput_from_spans():
    from loraplex.accounting.cost_model import measured_throughput

    # 100 prompt tokens over [0, 1), 200 completion tokens over [1, 3); a 1-token request at 5.
    tp = measured_throughput([(0.0, 1.0, 3.0, 100, 200), (5.0, 5.0, 5.0, 0, 1)], 0.0, 10.0, 1.0)
    assert tp.requests == 2 and tp.tokens == 301
    assert tp.peak_tokens_per_s == 100.0 and tp.avg_tokens_per_s == 30.1
    assert tp.utilization == 0.301


def test_spread_makes_progress_where_float_rounding_lands_on_a_bucket_edge():
    from loraplex.accounting.cost_model import measured_throughput

    # (t0 + 60 - t0) // 60 == 0 for this t0: recomputing the bucket from the position looped forever.
    t0 = 0.1 * 41
    assert (t0 + 60 - t0) // 60 == 0
    tp = measured_throughput([(t0, t0, t0 + 200, 0, 200)], t0, t0 + 300, 60)
    assert round(tp.tokens, 6) == 200 and round(tp.peak_tokens_per_s, 6) == 1.0
