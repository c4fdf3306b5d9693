import csv
import io
import json
from datetime import datetime, timedelta, timezone
from decimal import Decimal

import pytest

from loraplex.accounting.billing_export import billing_export, event_id
from loraplex.accounting.config import PricingConfig, TokenPrice
from loraplex.accounting.ledger import UsageLedger
from loraplex.accounting.pricing import PriceBook
from loraplex.accounting.report import usage_report
from loraplex.accounting.statement import Statement, monthly_statement
from loraplex.accounting.statement import StatementLine
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
    assert keys("adapter") == ["(base)", "sql-bot@3f2a"]  # the base model's row is named
    assert keys("model") == ["llama", "qwen"]


def test_csv_and_table(ledger):
    rep = usage_report(ledger.engine, PRICES, *NOV, group_by="adapter", tenant_id="t1")
    rows = list(csv.DictReader(io.StringIO(rep.to_csv())))
    assert [r["adapter"] for r in rows] == ["(base)", "sql-bot@3f2a"]
    assert {k for k in rows[0]} >= {"prompt_tokens", "cached_prompt_tokens", "completion_tokens", "requests", "cost"}
    assert sum(Decimal(r["cost"]) for r in rows) == rep.total.cost
    table = rep.to_table().splitlines()
    assert table[-1].split() == ["TOTAL", "400", "160", "80", "4", str(4 * T1_COST)]
    assert table[2].split()[:2] == ["(base)", "300"] and table[3].split()[:1] == ["sql-bot@3f2a"]
    d = rep.to_dict()
    assert {k: d[k] for k in ("tenant", "start", "end", "group_by", "currency")} == {
        "tenant": "t1", "start": "2026-11-01T00:00:00+00:00", "end": "2026-12-01T00:00:00+00:00",
        "group_by": "adapter", "currency": "USD"}
    assert d["total"] == {"prompt_tokens": 400, "cached_prompt_tokens": 160, "completion_tokens": 80,
                          "requests": 4, "cost": str(4 * T1_COST)}
    assert [r["adapter"] for r in d["rows"]] == ["(base)", "sql-bot@3f2a"]
    # group_by defaults to day.
    assert [r.key for r in usage_report(ledger.engine, PRICES, *NOV, tenant_id="t1").rows] == [
        "2026-11-03", "2026-11-04"]


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
    assert book.currency == "USD" and PriceBook.from_config(PricingConfig(currency="EUR")).currency == "EUR"
    with pytest.raises(ValueError, match="default_plan 'gold' has no prices"):
        PriceBook.from_config(PricingConfig(default_plan="gold"))


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
    assert e["data"] == {"meter": "cached_input_tokens", "quantity": 120, "tenant": "t1", "model": "qwen",
                         "period": "2026-11",
                         "day": "2026-11-03", "window_start": "2026-11-03T00:00:00Z",
                         "window_end": "2026-11-04T00:00:00Z"}
    assert {e["specversion"], e["type"], e["source"], e["time"]} == {"1.0", "io.loraplex.usage.tokens", "loraplex",
                                                                     "2026-11-03T00:00:00Z"}
    # Quantities per meter add up to the usage report.
    rep = usage_report(ledger.engine, PRICES, *NOV, group_by="tenant")
    assert sum(e["data"]["quantity"] for e in events if e["data"]["meter"] == "output_tokens") \
        == rep.total.completion_tokens


def statement_of(*amounts: str) -> Statement:
    st = Statement("t1", "2026-11", "default", "USD", requests=1)
    st.lines = [StatementLine("input_tokens", 1, Decimal(1), Decimal(a)) for a in amounts]
    return st


@pytest.mark.parametrize("amounts, total_due", [
    # A half cent exactly: half-up goes up; half-even (0.12, 2.90) and truncation (0.12, 2.90) do not.
    (["0.125"], "0.13"),
    (["2.905"], "2.91"),
    (["0.0050000"], "0.01"),
    (["0.1249999"], "0.12"),  # just under the half: down, so not a ceiling either
    (["0.135"], "0.14"),      # half-even agrees here, truncation does not
    # Once, on the total: each line alone rounds to 0.00, their sum to 0.01 ...
    (["0.004", "0.004", "0.003"], "0.01"),
    # ... and each line alone would round up to 0.01 (0.02 in all), their sum only to 0.01.
    (["0.006", "0.006"], "0.01"),
])
def test_total_due_rounds_once_half_up_to_cents(amounts, total_due):
    st = statement_of(*amounts)
    assert st.subtotal == sum((Decimal(a) for a in amounts), Decimal(0))
    assert str(st.total_due) == total_due
    assert st.to_dict()["total_due"] == total_due and st.to_dict()["subtotal"] == str(st.subtotal)
    *_, last = csv.reader(io.StringIO(st.to_csv()))
    assert last[4:] == ["", "total_due", "", "", total_due]
    assert st.to_table().splitlines()[-1].split()[-1] == total_due


def test_monthly_statement_rounds_a_half_cent_up_and_only_the_total(db_url, tmp_path):
    with UsageLedger(db_url, tmp_path / "spool") as ledger:
        # Lines of 0.004 + 0.004 + 0.003: none reaches a cent alone, the total is 0.011.
        ledger.append(make_record(1, tenant="t3", prompt_tokens=88_000, cached_prompt_tokens=80_000,
                                  completion_tokens=2_000))
        # 10,000 input tokens at 0.50 / 1M: exactly half a cent.
        ledger.append(make_record(1, tenant="t4", prompt_tokens=10_000, cached_prompt_tokens=0,
                                  completion_tokens=0))
        ledger.append(make_record(1, tenant="t2"))
        ledger.flush()
        per_line = monthly_statement(ledger.engine, PRICES, "t3", "2026-11")
        half = monthly_statement(ledger.engine, PRICES, "t4", "2026-11")
        override = monthly_statement(ledger.engine, PRICES, "t2", "2026-11")
    # The tenant's own prices, not the default plan's.
    assert override.plan == "override" and override.total_due == Decimal("0.00")
    assert [ln.unit_price for ln in override.lines] == [Decimal("2"), Decimal("0.2"), Decimal("6")]
    assert override.subtotal == T2_COST
    assert per_line.to_dict() == {
        "tenant": "t3", "period": "2026-11", "plan": "default", "currency": "USD", "requests": 1,
        "lines": [{"model": "qwen", "meter": "input_tokens", "quantity": 8_000, "unit_price_per_1m": "0.50",
                   "amount": "0.004"},
                  {"model": "qwen", "meter": "cached_input_tokens", "quantity": 80_000, "unit_price_per_1m": "0.05",
                   "amount": "0.004"},
                  {"model": "qwen", "meter": "output_tokens", "quantity": 2_000, "unit_price_per_1m": "1.50",
                   "amount": "0.003"}],
        "subtotal": "0.011", "total_due": "0.01"}
    assert per_line.to_csv().splitlines() == [
        "tenant,period,plan,currency,model,meter,quantity,unit_price_per_1m,amount",
        "t3,2026-11,default,USD,qwen,input_tokens,8000,0.50,0.004",
        "t3,2026-11,default,USD,qwen,cached_input_tokens,80000,0.05,0.004",
        "t3,2026-11,default,USD,qwen,output_tokens,2000,1.50,0.003",
        "t3,2026-11,default,USD,,total_due,,,0.01"]
    table = per_line.to_table().splitlines()
    assert table[0] == "Statement t3 2026-11 (plan default, 1 requests)"
    assert table[1].split() == ["model", "meter", "quantity", "USD/1M", "amount"]
    assert table[3].split() == ["qwen", "input_tokens", "8000", "0.50", "0.004"]
    assert table[-1].split() == ["TOTAL", "DUE", "0.01"]
    assert half.subtotal == Decimal("0.005") and half.to_dict()["total_due"] == "0.01"


# Computed once from the code and written here by hand: the ids are what billing systems
# de-duplicate on, so a changed namespace or key format must fail here (it would re-bill every
# re-export), not be compared with the code's own event_id().
PINNED_EVENTS = {  # (tenant, meter, day): (id, quantity)
    ("t1", "input_tokens", "2026-11-03"): ("37fafa1b-d0a4-5c56-b1cf-b23c5eefb6dd", 180),
    ("t1", "cached_input_tokens", "2026-11-03"): ("55f4d878-5cd8-5ded-af0b-527f05919ac9", 120),
    ("t1", "output_tokens", "2026-11-03"): ("c543347e-88bf-5fe4-91d3-015bdbac9db9", 60),
    ("t1", "input_tokens", "2026-11-04"): ("80eefbbb-26dc-500c-913f-da5e927c79cd", 60),
    ("t1", "cached_input_tokens", "2026-11-04"): ("05e73f7f-be8d-5337-9051-adfd48005e53", 40),
    ("t1", "output_tokens", "2026-11-04"): ("5c39a2b9-2b5e-5786-b8ea-c21f18d06f64", 20),
    ("t2", "input_tokens", "2026-11-03"): ("131b6083-b851-5d12-a4c6-c2432305b784", 120),
    ("t2", "cached_input_tokens", "2026-11-03"): ("b30fc988-57c2-5832-8479-136991763608", 80),
    ("t2", "output_tokens", "2026-11-03"): ("83862e38-e105-5602-8eaa-50ce36222508", 40),
}


def test_billing_event_ids_are_pinned_literals(ledger):
    assert event_id("t1", "output_tokens", "2026-11", "2026-11-03") == "c543347e-88bf-5fe4-91d3-015bdbac9db9"
    export = billing_export(ledger.engine, "2026-11", now=datetime(2026, 12, 5, tzinfo=timezone.utc))
    # In order (tenant, day, meter), with the ids and quantities above; CSV and JSONL agree.
    got = [((e["subject"], e["data"]["meter"], e["data"]["day"]), (e["id"], e["data"]["quantity"]))
           for e in export.events]
    assert got == list(PINNED_EVENTS.items())
    rows = list(csv.DictReader(io.StringIO(export.to_csv())))
    assert [(r["id"], int(r["quantity"]), r["tenant"], r["day"], r["time"]) for r in rows] == [
        (i, q, t, d, f"{d}T00:00:00Z") for (t, _, d), (i, q) in PINNED_EVENTS.items()]
    assert [json.loads(line)["id"] for line in export.to_jsonl().splitlines()] == [
        i for i, _ in PINNED_EVENTS.values()]
    # A meter with no tokens that day is no event (t1 at 0 cached tokens on a day).


def test_billing_export_cuts_at_midnight_after_the_grace(db_url, tmp_path):
    midnight = datetime(2026, 11, 4, tzinfo=timezone.utc)
    with UsageLedger(db_url, tmp_path / "spool") as ledger:
        # make_record finishes 1 s after `at`: one record just before midnight, one exactly at it.
        # No cached tokens: that meter has no event, and the output meter after it still does.
        ledger.append(make_record(1, tenant="t9", at=midnight - timedelta(seconds=2), cached_prompt_tokens=0))
        ledger.append(make_record(2, tenant="t9", at=midnight - timedelta(seconds=1), cached_prompt_tokens=0))
        ledger.append(make_record(1, tenant="t8"))
        ledger.flush()
        # 01:30:30.5 less an hour of grace: the 3rd is final, the 4th (from 00:00:00.000000) is not.
        export = billing_export(ledger.engine, "2026-11", grace=timedelta(hours=1), tenant_id="t9",
                                now=midnight + timedelta(hours=1, minutes=30, seconds=30, microseconds=500_000))
        # Right at the first day's end plus grace, nothing is final yet.
        none = billing_export(ledger.engine, "2026-11", grace=timedelta(hours=1),
                              now=datetime(2026, 11, 1, 1, tzinfo=timezone.utc))
        # Without `now`: the current time (so nothing of November 2026 is closed before it).
        assert billing_export(ledger.engine, "2000-01", tenant_id="t9").complete
    assert (export.period, export.complete, export.through) == ("2026-11", False, "2026-11-03")
    assert [(e["subject"], e["data"]["meter"], e["data"]["day"], e["data"]["quantity"]) for e in export.events] == [
        ("t9", "input_tokens", "2026-11-03", 100), ("t9", "output_tokens", "2026-11-03", 20)]
    assert (none.events, none.complete, none.through) == ([], False, None)
    first, _ = export.to_jsonl().splitlines()
    assert first == (
        '{"data":{"day":"2026-11-03","meter":"input_tokens","model":"qwen","period":"2026-11","quantity":100,'
        '"tenant":"t9",'
        '"window_end":"2026-11-04T00:00:00Z","window_start":"2026-11-03T00:00:00Z"},'
        '"datacontenttype":"application/json","id":"%s","source":"loraplex","specversion":"1.0",'
        '"subject":"t9","time":"2026-11-03T00:00:00Z","type":"io.loraplex.usage.tokens"}'
        % event_id("t9", "input_tokens", "2026-11", "2026-11-03"))
    assert export.to_csv().splitlines()[:2] == [
        "id,time,tenant,meter,quantity,period,day,model",
        f"{export.events[0]['id']},2026-11-03T00:00:00Z,t9,input_tokens,100,2026-11,2026-11-03,qwen"]


def test_billing_export_only_includes_closed_days(ledger):
    early = billing_export(ledger.engine, "2026-11", now=datetime(2026, 11, 4, 0, 30, tzinfo=timezone.utc))
    assert early.events == [] and not early.complete and early.through == "2026-11-02"
    mid = billing_export(ledger.engine, "2026-11", now=datetime(2026, 11, 4, 1, 30, tzinfo=timezone.utc))
    assert {e["data"]["day"] for e in mid.events} == {"2026-11-03"} and not mid.complete
    full = billing_export(ledger.engine, "2026-11", now=datetime(2026, 12, 5, tzinfo=timezone.utc))
    assert {e["id"]: e for e in full.events if e["data"]["day"] == "2026-11-03"} == {e["id"]: e for e in mid.events}
    with pytest.raises(ValueError):
        billing_export(ledger.engine, "2026-13")
