"""Accounting: what a process needs to meter usage and answer usage questions.

Built once per replica from PlatformConfig: the ledger (the request path appends to it), the
database it flushes into (reports read it), and the price book (plan lookups go to tenancy).
"""
from dataclasses import dataclass
from typing import Callable

from sqlalchemy import Engine

from loraplex.accounting.config import AccountingConfig
from loraplex.accounting.ledger import UsageLedger
from loraplex.accounting.pricing import PriceBook


@dataclass
class Accounting:
    config: AccountingConfig
    db: Engine
    prices: PriceBook
    ledger: UsageLedger | None = None  # None where nothing is metered (CLI, report-only tests)

    @classmethod
    def start(cls, cfg: AccountingConfig, db: Engine, replica_id: str,
              plan_of: Callable[[str], str | None] | None = None) -> "Accounting":
        """Migrate, replay what a crash left in this replica's (and dead siblings') spool, start flushing."""
        ledger = UsageLedger.from_config(cfg, replica_id, engine=db).start()
        return cls(cfg, db, PriceBook.from_config(cfg.pricing, plan_of), ledger)

    def close(self) -> None:
        if self.ledger is not None:
            self.ledger.close()
