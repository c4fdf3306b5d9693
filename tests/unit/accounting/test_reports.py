import csv
import io
import json
from datetime import datetime, timedelta, timezone
from decimal import Decimal

import pytest

from loraplex.accounting import (PriceBook, PricingConfig, TokenPrice, UsageLedger, billing_export, event_id,
                                 monthly_statement, usage_report)
from usage_builders import T0, make_record

NOV = (datetime(2026, 11, 1, tzinfo=timezone.utc), datetime(2026, 12, 1, tzinfo=timezone.utc))
PRICES = PriceBook.from_config(PricingConfig(
    plans={"default": TokenPrice(input=Decimal("0.50"), cached_input=Decimal("0.05"), output=Decimal("1.50")),
           "pro": TokenPrice(input=Decimal("0.40"), cached_input=Decimal("0.04"), output=Decimal("1.20"))},
    tenant_overrides={"t2": TokenPrice(input=Decimal("2"), cached_input=Decimal("0.2"), output=Decimal("6"))}))
# make_record: 100 prompt (40 cached), 20 completion tokens
T1_COST = Decimal("0.000062")  # (60*0.50 + 40*0.05 + 20*1.50) / 1e6
T2_COST = Decimal("0.000248")  # (60*2 + 40*0.2 + 20*6) / 1e6


@pytest.fixture
def ledger(db_url, tmp_path):
    with UsageLedger(db_url, tmp_path / "spool") as ledger:
        day4 = T0 + timedelta(days=1)
        for r in [make_record(1), make_record(2), make_record(3, at=T0 + timedelta(hours=1)),
                  make_record(4, at=day4, adapter="sql-bot@3f2a", base_model="llama"),
                  make_record(1, tenant="t2"), make_record(2, tenant="t2", adapter="sql-bot@3f2a"),
                  # outside November: finish_time exactly at the end bound is excluded
                  make_record(5, at=NOV[1] - timedelta(seconds=1)),
                  make_record(6, at=NOV[0] - timedelta(hours=1))]:
            ledger.append(r)
        ledger.flush()
        yield ledger


@pytest.mark.parametrize("group_by", ["day", "hour", "adapter", "model", "tenant"])
@pytest.mark.parametrize("tenant", [None, "t1", "t2"])
def test_total_equals_sum_of_rows(ledger, group_by, tenant):
    rep = usage_report(ledger.engine, PRICES, *NOV, group_by=group_by, tenant_id=tenant)
    for col in ("prompt_tokens", "cached_prompt_tokens", "completion_tokens", "requests", "cost"):
        assert sum((getattr(r, col) for r in rep.rows), type(getattr(rep.total, col))(0)) == getattr(rep.total, col)
    expected_requests = {None: 6, "t1": 4, "t2": 2}[tenant]
    assert rep.total.requests == expected_requests
    assert rep.total.cost == {None: 4 * T1_COST + 2 * T2_COST, "t1": 4 * T1_COST, "t2": 2 * T2_COST}[tenant]


def test_day_rows_and_exact_decimal_cost(ledger):
    rep = usage_report(ledger.engine, PRICES, *NOV, group_by="day")
    assert [(r.key, r.requests, r.prompt_tokens, r.cached_prompt_tokens, r.completion_tokens, r.cost)
            for r in rep.rows] == [
        ("2026-11-03", 5, 500, 200, 100, Decimal("0.000682")),
        ("2026-11-04", 1, 100, 40, 20, Decimal("0.000062")),
    ]
    assert rep.total.cost == Decimal("0.000744")
    d = json.loads(json.dumps(rep.to_dict()))
    assert d["rows"][0] == {"day": "2026-11-03", "prompt_tokens": 500, "cached_prompt_tokens": 200,
                            "completion_tokens": 100, "requests": 5, "cost": "0.000682"}
    assert d["total"]["cost"] == "0.000744" and d["total"]["requests"] == 6 and d["currency"] == "USD"


def test_hour_adapter_model_keys(ledger):
    keys = lambda g: [r.key for r in usage_report(ledger.engine, PRICES, *NOV, group_by=g).rows]  # noqa: E731
    assert keys("hour") == ["2026-11-03T10:00:00Z", "2026-11-03T11:00:00Z", "2026-11-04T10:00:00Z"]
    assert keys("adapter") == [None, "sql-bot@3f2a"]
    assert keys("model") == ["llama", "qwen"]


def test_csv_and_table(ledger):
    rep = usage_report(ledger.engine, PRICES, *NOV, group_by="adapter", tenant_id="t1")
    rows = list(csv.DictReader(io.StringIO(rep.to_csv())))
    assert [r["adapter"] for r in rows] == ["", "sql-bot@3f2a"]
    assert {k for k in rows[0]} >= {"prompt_tokens", "cached_prompt_tokens", "completion_tokens", "requests", "cost"}
    assert sum(Decimal(r["cost"]) for r in rows) == rep.total.cost
    table = rep.to_table()
    assert "TOTAL" in table and "sql-bot@3f2a" in table


def test_bad_arguments_raise_value_error(ledger):
    with pytest.raises(ValueError):
        usage_report(ledger.engine, PRICES, *NOV, group_by="week")
    with pytest.raises(ValueError):
        usage_report(ledger.engine, PRICES, NOV[1], NOV[0])


def test_price_book_resolution():
    book = PriceBook.from_config(PRICES_CFG, plan_of={"t3": "pro", "t4": "gone"}.get)
    assert book.plan_for("t2") == "override" and book.plan_for("t3") == "pro"
    assert book.plan_for("t4") == "default" and book.plan_for("nobody") == "default"
    assert book.cost("t3", 1_000_000, 0, 0) == Decimal("0.40")


PRICES_CFG = PricingConfig(
    plans={"default": TokenPrice(input="0.50", cached_input="0.05", output="1.50"),
           "pro": TokenPrice(input="0.40", cached_input="0.04", output="1.20")},
    tenant_overrides={"t2": TokenPrice(input="2", cached_input="0.2", output="6")})


def test_monthly_statement_is_exact_and_rounds_once(db_url, tmp_path):
    with UsageLedger(db_url, tmp_path / "spool") as ledger:
        ledger.append(make_record(1, tenant="t3", prompt_tokens=3_000_001, cached_prompt_tokens=1_000_000,
                                  completion_tokens=1_234_567))
        ledger.append(make_record(2, tenant="t3", at=datetime(2026, 12, 1, tzinfo=timezone.utc)))  # December
        ledger.flush()
        st = monthly_statement(ledger.engine, PRICES, "t3", "2026-11")
    assert st.requests == 1 and st.plan == "default"
    assert [(ln.meter, ln.quantity, ln.amount) for ln in st.lines] == [
        ("input_tokens", 2_000_001, Decimal("1.0000005")),
        ("cached_input_tokens", 1_000_000, Decimal("0.05")),
        ("output_tokens", 1_234_567, Decimal("1.8518505")),
    ]
    assert st.subtotal == Decimal("2.901851") and st.total_due == Decimal("2.90")
    assert st.to_dict()["total_due"] == "2.90" and "TOTAL DUE" in st.to_table()


def test_billing_export_ids_are_stable(ledger):
    after = datetime(2026, 12, 5, tzinfo=timezone.utc)
    first = billing_export(ledger.engine, "2026-11", now=after)
    second = billing_export(ledger.engine, "2026-11", now=after)
    assert first.complete and first.through == "2026-11-30"
    assert first.to_jsonl() == second.to_jsonl() and first.to_csv() == second.to_csv()
    events = [json.loads(line) for line in first.to_jsonl().splitlines()]
    assert len({e["id"] for e in events}) == len(events) == 9  # (t1 x 2 days + t2 x 1 day) x 3 meters
    e = next(e for e in events if e["subject"] == "t1" and e["data"]["meter"] == "cached_input_tokens"
             and e["data"]["day"] == "2026-11-03")
    assert e["id"] == event_id("t1", "cached_input_tokens", "2026-11", "2026-11-03")
    assert e["data"] == {"meter": "cached_input_tokens", "quantity": 120, "tenant": "t1", "period": "2026-11",
                         "day": "2026-11-03", "window_start": "2026-11-03T00:00:00Z",
                         "window_end": "2026-11-04T00:00:00Z"}
    assert {e["specversion"], e["type"], e["source"], e["time"]} == {"1.0", "io.loraplex.usage.tokens", "loraplex",
                                                                     "2026-11-03T00:00:00Z"}
    # Quantities per meter add up to the usage report.
    rep = usage_report(ledger.engine, PRICES, *NOV, group_by="tenant")
    assert sum(e["data"]["quantity"] for e in events if e["data"]["meter"] == "output_tokens") \
        == rep.total.completion_tokens


def test_billing_export_only_includes_closed_days(ledger):
    early = billing_export(ledger.engine, "2026-11", now=datetime(2026, 11, 4, 0, 30, tzinfo=timezone.utc))
    assert early.events == [] and not early.complete and early.through == "2026-11-02"
    mid = billing_export(ledger.engine, "2026-11", now=datetime(2026, 11, 4, 1, 30, tzinfo=timezone.utc))
    assert {e["data"]["day"] for e in mid.events} == {"2026-11-03"} and not mid.complete
    full = billing_export(ledger.engine, "2026-11", now=datetime(2026, 12, 5, tzinfo=timezone.utc))
    assert {e["id"]: e for e in full.events if e["data"]["day"] == "2026-11-03"} == {e["id"]: e for e in mid.events}
    with pytest.raises(ValueError):
        billing_export(ledger.engine, "2026-13")
