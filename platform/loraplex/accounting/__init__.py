"""Usage accounting: records -> spool -> ledger (DB) -> reports, statements, billing, cost model.

Import the module you need: this file imports nothing, so loading one piece (the config) does
not load the rest (the ledger, SQLAlchemy).
"""
