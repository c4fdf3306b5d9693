"""The ledger's month-to-date tokens of a tenant (or of a tenant on one base model), for
`monthly_token_budget`."""

from __future__ import annotations

from datetime import datetime
from typing import Optional

from sqlalchemy import Engine

from loraplex.accounting.usage_query import tokens_since


def month_to_date(db: Engine, tenant_id: str, month: datetime, request_ids: list[str],
                  base_model: Optional[str] = None) -> tuple[float, set[str]]:
    """(prompt + completion tokens of the tenant's records finished since `month`, only those on
    `base_model` if given; which of `request_ids` the ledger has): usage_query.tokens_since."""
    return tokens_since(db, tenant_id, month, request_ids, base_model=base_model)
