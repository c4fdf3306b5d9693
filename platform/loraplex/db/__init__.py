"""Database plumbing shared by the platform: engine factory, metadata, migrations.

Import the module you need: this file imports nothing, so loading one piece (the config) does
not load the rest (the ledger, SQLAlchemy).
"""
