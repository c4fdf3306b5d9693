"""Money and months have one home each: the meters (prompt minus cached) and Price in
accounting/pricing.py, the margin in accounting/cost_model.py, the UTC month in
accounting/period.py; a statement, an export and the budget's month all go through them."""
from datetime import datetime, timedelta, timezone
from decimal import Decimal

import pytest

from loraplex.accounting.cost_model import margin
from loraplex.accounting.period import month_bounds, period_bounds
from loraplex.accounting.pricing import METERS, Price, meter_quantities
from loraplex.admission.core import month_start, next_month_start

UTC = timezone.utc


def test_meters_take_the_cached_tokens_off_the_prompt_once():
    assert meter_quantities(10, 3, 5) == {"input_tokens": 7, "cached_input_tokens": 3, "output_tokens": 5}
    assert tuple(meter_quantities(0, 0, 0)) == METERS


def test_cost_is_the_sum_of_the_meters_amounts_exactly():
    price = Price(Decimal("0.50"), Decimal("0.05"), Decimal("1.50"))
    amounts = [price.amount(m, q) for m, q in meter_quantities(1_000_003, 7, 11).items()]
    assert price.cost(1_000_003, 7, 11) == sum(amounts) == Decimal("0.50001485")
    assert price.cost(1_000_000, 0, 0) == Decimal("0.5")
    assert price.cost(2, 2, 0) == Decimal("0.05") * 2 / 1_000_000


def test_margin():
    assert margin(Decimal("3"), Decimal("1.25")) == Decimal("1.75")
    assert margin(None, Decimal("1")) is None


@pytest.mark.parametrize("t, start, end", [
    (datetime(2026, 12, 31, 23, 59, tzinfo=UTC), datetime(2026, 12, 1, tzinfo=UTC), datetime(2027, 1, 1, tzinfo=UTC)),
    (datetime(2026, 3, 1, tzinfo=UTC), datetime(2026, 3, 1, tzinfo=UTC), datetime(2026, 4, 1, tzinfo=UTC)),
    # 00:30 on Apr 1 at +01:00 is still March in UTC.
    (datetime(2026, 4, 1, 0, 30, tzinfo=timezone(timedelta(hours=1))), datetime(2026, 3, 1, tzinfo=UTC),
     datetime(2026, 4, 1, tzinfo=UTC)),
])
def test_month_bounds_are_the_utc_month(t, start, end):
    assert month_bounds(t) == (start, end)


def test_periods_and_the_budgets_month_use_the_same_bounds():
    t = datetime(2026, 12, 15, 8, tzinfo=UTC)
    assert period_bounds("2026-12") == month_bounds(t)
    assert month_start(t.timestamp()) == month_bounds(t)[0]
    assert next_month_start(t.timestamp()) == month_bounds(t)[1].timestamp()
    assert month_bounds(datetime(9999, 12, 5, tzinfo=UTC))[1] == datetime.max.replace(tzinfo=UTC)
    with pytest.raises(ValueError):
        period_bounds("9999-12")
