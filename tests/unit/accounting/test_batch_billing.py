"""Batch API lines (UsageRecord.batch): priced at the plan's batch_discount, reported apart
(group_by=batch), on the statement and in the billing export as the batch_* meters."""

from datetime import datetime, timezone
from decimal import Decimal

from loraplex.accounting.billing_export import billing_export
from loraplex.accounting.config import PricingConfig, TokenPrice
from loraplex.accounting.ledger import UsageLedger
from loraplex.accounting.pricing import PriceBook
from loraplex.accounting.report import usage_report
from loraplex.accounting.statement import monthly_statement
from usage_builders import make_record

NOV = (datetime(2026, 11, 1, tzinfo=timezone.utc), datetime(2026, 12, 1, tzinfo=timezone.utc))
PRICES = PriceBook.from_config(PricingConfig(plans={"default": TokenPrice(
    input=Decimal("0.50"), cached_input=Decimal("0.05"), output=Decimal("1.50"), batch_discount=Decimal("0.4"))}))
ONLINE = Decimal("0.000062")  # make_record: (60*0.50 + 40*0.05 + 20*1.50) / 1e6
BATCH = ONLINE * Decimal("0.6")


def ledger_with_both(db_url, tmp_path):
    ledger = UsageLedger(db_url, tmp_path / "spool").start()
    ledger.append(make_record(1))
    ledger.append(make_record(2, batch=True))
    ledger.append(make_record(3, batch=True))
    ledger.flush()
    return ledger


def test_batch_usage_is_priced_at_the_plans_discount_and_reported_apart(db_url, tmp_path):
    ledger = ledger_with_both(db_url, tmp_path)
    try:
        report = usage_report(ledger.engine, PRICES, *NOV, group_by="batch")
        rows = {r.key: (r.requests, r.cost) for r in report.rows}
        assert rows == {"batch": (2, 2 * BATCH), "online": (1, ONLINE)}
        assert usage_report(ledger.engine, PRICES, *NOV, group_by="day").total.cost == ONLINE + 2 * BATCH
    finally:
        ledger.close()


def test_the_statement_and_the_export_bill_the_batch_meters(db_url, tmp_path):
    ledger = ledger_with_both(db_url, tmp_path)
    try:
        st = monthly_statement(ledger.engine, PRICES, "t1", "2026-11")
        lines = {ln.meter: (ln.quantity, ln.unit_price) for ln in st.lines}
        assert lines["input_tokens"] == (60, Decimal("0.50"))
        assert lines["batch_input_tokens"] == (120, Decimal("0.300"))
        assert lines["batch_output_tokens"] == (40, Decimal("0.900"))
        assert st.subtotal == ONLINE + 2 * BATCH
        export = billing_export(ledger.engine, "2026-11", now=datetime(2026, 12, 5, tzinfo=timezone.utc))
        meters = {e["data"]["meter"]: e["data"]["quantity"] for e in export.events}
        assert meters == {"input_tokens": 60, "cached_input_tokens": 40, "output_tokens": 20,
                          "batch_input_tokens": 120, "batch_cached_input_tokens": 80, "batch_output_tokens": 40}
        assert len({e["id"] for e in export.events}) == len(export.events)
    finally:
        ledger.close()


def test_a_statement_without_batch_usage_has_only_the_online_meters(db_url, tmp_path):
    with UsageLedger(db_url, tmp_path / "spool") as ledger:
        ledger.append(make_record(1))
        ledger.flush()
        st = monthly_statement(ledger.engine, PRICES, "t1", "2026-11")
    assert [ln.meter for ln in st.lines] == ["input_tokens", "cached_input_tokens", "output_tokens"]
