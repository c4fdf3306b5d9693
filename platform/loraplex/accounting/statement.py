from dataclasses import dataclass, field
from decimal import ROUND_HALF_UP, Decimal

from sqlalchemy import Engine

from loraplex.accounting import render
from loraplex.accounting.period import period_bounds
from loraplex.accounting.pricing import BATCH_METERS, METERS, PriceBook, billed_quantities
from loraplex.accounting.usage_query import usage_totals

CENT = Decimal("0.01")
CSV_COLUMNS = ["tenant", "period", "plan", "currency", "model", "meter", "quantity", "unit_price_per_1m", "amount"]


@dataclass
class StatementLine:
    meter: str               # input_tokens | cached_input_tokens | output_tokens | batch_<those> (Batch API lines)
    quantity: int
    unit_price: Decimal      # per 1M tokens
    amount: Decimal          # exact
    model: str | None = None  # the base model whose tokens these are (each base has its lines, at its price)


@dataclass
class Statement:
    tenant_id: str
    period: str
    plan: str
    currency: str
    requests: int
    lines: list[StatementLine] = field(default_factory=list)

    @property
    def subtotal(self) -> Decimal:
        return sum((ln.amount for ln in self.lines), Decimal(0))

    @property
    def total_due(self) -> Decimal:
        # Round once, on the invoice total, never per line or per request.
        return self.subtotal.quantize(CENT, rounding=ROUND_HALF_UP)

    def to_dict(self) -> dict:
        return {"tenant": self.tenant_id, "period": self.period, "plan": self.plan, "currency": self.currency,
                "requests": self.requests,
                "lines": [{"model": ln.model, "meter": ln.meter, "quantity": ln.quantity,
                           "unit_price_per_1m": str(ln.unit_price),
                           "amount": str(ln.amount)} for ln in self.lines],
                "subtotal": str(self.subtotal), "total_due": str(self.total_due)}

    def to_csv(self) -> str:
        """One row per base model and meter, then a `total_due` row (amount only, rounded once)."""
        rows = [[self.tenant_id, self.period, self.plan, self.currency, ln.model or "", ln.meter, ln.quantity,
                 str(ln.unit_price), str(ln.amount)] for ln in self.lines]
        rows.append([self.tenant_id, self.period, self.plan, self.currency, "", "total_due", "", "",
                     str(self.total_due)])
        return render.csv_text(CSV_COLUMNS, rows)

    def to_table(self) -> str:
        rows = [[ln.model or "", ln.meter, ln.quantity, str(ln.unit_price), str(ln.amount)] for ln in self.lines]
        head = f"Statement {self.tenant_id} {self.period} (plan {self.plan}, {self.requests} requests)\n"
        return head + render.text_table(["model", "meter", "quantity", f"{self.currency}/1M", "amount"], rows,
                                        footer=["TOTAL DUE", "", "", "", str(self.total_due)])


def monthly_statement(engine: Engine, prices: PriceBook, tenant_id: str, period: str) -> Statement:
    """A tenant's bill for YYYY-MM at its current price (price changes mid-month are not modelled):
    the meters of each base model it used, at that base's price, bases in name order. A month
    without usage has no lines (nothing used, no base to price)."""
    start, end = period_bounds(period)
    with engine.connect() as conn:
        totals = usage_totals(conn, start, end, "tenant", tenant_id)
    quantities: dict[str, dict[str, int]] = {}  # base model -> meter -> tokens
    for t in totals:
        per_meter = quantities.setdefault(t.base_model, dict.fromkeys(METERS + BATCH_METERS, 0))
        for meter, qty in billed_quantities(t.prompt_tokens, t.cached_prompt_tokens, t.completion_tokens, t.batch).items():
            per_meter[meter] += qty
    st = Statement(tenant_id, period, prices.plan_for(tenant_id), prices.currency, sum(t.requests for t in totals))
    for model in sorted(quantities):
        price, per_meter = prices.price_for(tenant_id, model), quantities[model]
        batch_used = any(per_meter[m] for m in BATCH_METERS)
        for meter, qty in per_meter.items():
            if meter in METERS or batch_used:  # a base's batch lines only where it has batch usage
                st.lines.append(StatementLine(meter, qty, price.unit_price(meter), price.amount(meter, qty), model))
    return st
