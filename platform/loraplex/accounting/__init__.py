"""Usage accounting: records -> spool -> ledger (DB) -> reports, statements, billing, cost model."""
from loraplex.accounting.accounting import Accounting
from loraplex.accounting.billing_export import BillingExport, billing_export, event_id
from loraplex.accounting.config import AccountingConfig, CostModelConfig, PricingConfig, TokenPrice
from loraplex.accounting.cost_model import CostModelReport, cost_model_report
from loraplex.accounting.ledger import FlushResult, UsageLedger
from loraplex.accounting.period import parse_time, period_bounds
from loraplex.accounting.pricing import Price, PriceBook
from loraplex.accounting.record import STATUSES, UsageRecord
from loraplex.accounting.rejections import RejectionCount, rejection_counts
from loraplex.accounting.report import UsageReport, UsageRow, usage_report
from loraplex.accounting.spool import SpoolLocked, UsageSpool
from loraplex.accounting.statement import Statement, monthly_statement
from loraplex.accounting.tables import MIGRATIONS

__all__ = [
    "Accounting", "AccountingConfig", "BillingExport", "CostModelConfig", "CostModelReport", "FlushResult", "MIGRATIONS",
    "Price", "PriceBook", "PricingConfig", "RejectionCount", "STATUSES", "SpoolLocked", "Statement",
    "TokenPrice", "UsageLedger", "UsageRecord", "UsageReport", "UsageRow", "UsageSpool", "billing_export",
    "cost_model_report", "event_id", "monthly_statement", "parse_time", "period_bounds", "rejection_counts", "usage_report",
]
