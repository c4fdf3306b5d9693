"""Several base models in one deployment: a plan (or an override) prices a base's tokens apart,
and every cost (report rows, statement lines, revenue) prices each record at its base's price;
statements and the billing export split by base."""
from datetime import datetime, timedelta, timezone
from decimal import Decimal

import pytest
from pydantic import ValidationError

from loraplex.accounting.billing_export import billing_export, event_id
from loraplex.accounting.config import PricingConfig, TokenPrice
from loraplex.accounting.cost_model import cost_model_report
from loraplex.accounting.ledger import UsageLedger
from loraplex.accounting.pricing import Price, PriceBook
from loraplex.accounting.report import usage_report
from loraplex.accounting.statement import monthly_statement
from usage_builders import T0, make_record

NOV = (datetime(2026, 11, 1, tzinfo=timezone.utc), datetime(2026, 12, 1, tzinfo=timezone.utc))
AFTER = datetime(2026, 12, 5, tzinfo=timezone.utc)
CFG = PricingConfig(
    plans={"default": TokenPrice(input="0.50", cached_input="0.05", output="1.50",
                                 models={"big": {"input": "2", "output": "6", "batch_discount": "0.25"}})},
    tenant_overrides={"t2": TokenPrice(input="1", cached_input="0.1", output="3", models={"big": {"output": "4"}})})
PRICES = PriceBook.from_config(CFG)
# make_record: 100 prompt (40 cached), 20 completion tokens
SMALL_COST = Decimal("0.000062")  # (60*0.50 + 40*0.05 + 20*1.50) / 1e6
BIG_COST = Decimal("0.000242")    # (60*2 + 40*0.05 + 20*6) / 1e6: cached input unset, the plan's


def test_a_base_s_unset_prices_are_the_plan_s():
    big = PRICES.price_for("t1", "big")
    assert (big.input, big.cached_input, big.output, big.batch_discount) == (
        Decimal("2"), Decimal("0.05"), Decimal("6"), Decimal("0.25"))
    # A base the plan does not name, and no base at all, get the plan's own prices.
    plan = Price(Decimal("0.50"), Decimal("0.05"), Decimal("1.50"), Decimal("0.5"))
    for base in ("small", None):
        p = PRICES.price_for("t1", base)
        assert (p.input, p.cached_input, p.output, p.batch_discount) == (
            plan.input, plan.cached_input, plan.output, plan.batch_discount)
    assert PRICES.cost("t1", 100, 40, 20, base_model="big") == BIG_COST
    assert PRICES.cost("t1", 100, 40, 20, base_model="small") == SMALL_COST


def test_an_override_prices_bases_from_its_own_prices_not_the_plan_s():
    big, small = PRICES.price_for("t2", "big"), PRICES.price_for("t2", "small")
    assert (big.input, big.cached_input, big.output) == (Decimal("1"), Decimal("0.1"), Decimal("4"))
    assert (small.input, small.cached_input, small.output) == (Decimal("1"), Decimal("0.1"), Decimal("3"))


def test_config_names_every_priced_base_and_refuses_bad_prices():
    assert CFG.priced_models() == {"big"}
    with pytest.raises(ValidationError, match="batch_discount"):
        TokenPrice(input="1", cached_input="1", output="1", models={"big": {"batch_discount": "2"}})
    with pytest.raises(ValidationError, match="outptu"):
        TokenPrice(input="1", cached_input="1", output="1", models={"big": {"outptu": "2"}})


@pytest.fixture
def ledger(db_url, tmp_path):
    """t1 on both bases on Nov 3 (one batch line on big), only on big on Nov 4; t2 on both on Nov 3."""
    with UsageLedger(db_url, tmp_path / "spool") as ledger:
        for r in [make_record(1, base_model="small"), make_record(2, base_model="big"),
                  make_record(3, base_model="big", batch=True),
                  make_record(4, base_model="big", at=T0 + timedelta(days=1)),
                  make_record(1, tenant="t2", base_model="small"), make_record(2, tenant="t2", base_model="big")]:
            ledger.append(r)
        ledger.flush()
        yield ledger


BIG_BATCH_COST = BIG_COST * Decimal("0.75")


def test_a_day_on_two_bases_is_priced_per_record_s_base(ledger):
    rep = usage_report(ledger.engine, PRICES, *NOV, group_by="day", tenant_id="t1")
    assert [(r.key, r.requests, r.cost) for r in rep.rows] == [
        ("2026-11-03", 3, SMALL_COST + BIG_COST + BIG_BATCH_COST), ("2026-11-04", 1, BIG_COST)]
    by_model = usage_report(ledger.engine, PRICES, *NOV, group_by="model", tenant_id="t1")
    assert [(r.key, r.requests, r.cost) for r in by_model.rows] == [
        ("big", 3, 2 * BIG_COST + BIG_BATCH_COST), ("small", 1, SMALL_COST)]
    # The revenue the cost model compares with the hardware is priced the same way.
    cm = cost_model_report(ledger.engine, *NOV, gpu_hour_price=Decimal(1), prices=PRICES)
    t2 = (Decimal(60 * 1 + 40 * Decimal("0.1") + 20 * 3) + Decimal(60 * 1 + 40 * Decimal("0.1") + 20 * 4)) / 10**6
    assert cm.revenue == SMALL_COST + 2 * BIG_COST + BIG_BATCH_COST + t2


def test_a_statement_has_each_base_s_lines_at_its_price(ledger):
    st = monthly_statement(ledger.engine, PRICES, "t1", "2026-11")
    assert [(ln.model, ln.meter, ln.quantity, ln.unit_price) for ln in st.lines] == [
        ("big", "input_tokens", 120, Decimal("2")), ("big", "cached_input_tokens", 80, Decimal("0.05")),
        ("big", "output_tokens", 40, Decimal("6")),
        # Batch lines only for the base with batch usage, at that base's batch discount.
        ("big", "batch_input_tokens", 60, Decimal("1.50")), ("big", "batch_cached_input_tokens", 40, Decimal("0.0375")),
        ("big", "batch_output_tokens", 20, Decimal("4.50")),
        ("small", "input_tokens", 60, Decimal("0.50")), ("small", "cached_input_tokens", 40, Decimal("0.05")),
        ("small", "output_tokens", 20, Decimal("1.50"))]
    assert st.subtotal == SMALL_COST + 2 * BIG_COST + BIG_BATCH_COST and st.requests == 4
    assert monthly_statement(ledger.engine, PRICES, "nobody", "2026-11").lines == []


def test_export_events_per_base_with_the_model_in_the_ids_of_days_on_several(ledger):
    events = billing_export(ledger.engine, "2026-11", now=AFTER, tenant_id="t1").events
    got = [(e["data"]["day"], e["data"]["model"], e["data"]["meter"], e["data"]["quantity"], e["id"]) for e in events]
    day3, day4 = "2026-11-03", "2026-11-04"
    assert got == [
        (day3, "big", "input_tokens", 60, event_id("t1", "input_tokens", "2026-11", day3, "big")),
        (day3, "big", "cached_input_tokens", 40, event_id("t1", "cached_input_tokens", "2026-11", day3, "big")),
        (day3, "big", "output_tokens", 20, event_id("t1", "output_tokens", "2026-11", day3, "big")),
        (day3, "big", "batch_input_tokens", 60, event_id("t1", "batch_input_tokens", "2026-11", day3, "big")),
        (day3, "big", "batch_cached_input_tokens", 40,
         event_id("t1", "batch_cached_input_tokens", "2026-11", day3, "big")),
        (day3, "big", "batch_output_tokens", 20, event_id("t1", "batch_output_tokens", "2026-11", day3, "big")),
        (day3, "small", "input_tokens", 60, event_id("t1", "input_tokens", "2026-11", day3, "small")),
        (day3, "small", "cached_input_tokens", 40, event_id("t1", "cached_input_tokens", "2026-11", day3, "small")),
        (day3, "small", "output_tokens", 20, event_id("t1", "output_tokens", "2026-11", day3, "small")),
        # A day on one base keeps the id without a model: what a single-base deployment always exported.
        (day4, "big", "input_tokens", 60, event_id("t1", "input_tokens", "2026-11", day4)),
        (day4, "big", "cached_input_tokens", 40, event_id("t1", "cached_input_tokens", "2026-11", day4)),
        (day4, "big", "output_tokens", 20, event_id("t1", "output_tokens", "2026-11", day4))]
    all_ids = [e["id"] for e in billing_export(ledger.engine, "2026-11", now=AFTER).events]
    assert len(set(all_ids)) == len(all_ids) == 12 + 6
    assert event_id("t1", "input_tokens", "2026-11", day3, "big") != event_id("t1", "input_tokens", "2026-11", day3)


def test_model_event_ids_are_pinned_literals():
    # Written by hand: billing systems de-duplicate on them; a changed key format must fail here.
    assert event_id("t1", "output_tokens", "2026-11", "2026-11-03", "big") == "f0048ef6-ca43-55ed-a1a6-8b93ae182bda"
    assert event_id("t1", "output_tokens", "2026-11", "2026-11-03") == "c543347e-88bf-5fe4-91d3-015bdbac9db9"
