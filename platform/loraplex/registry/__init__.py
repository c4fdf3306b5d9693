"""Adapter registry: safe archive extraction, LoRA validation, blobs by sha256, versions in the catalog.

archive.py (upload -> files), validator.py + model_spec.py (is it a LoRA the served model can
run), store.py (content-addressed blobs), catalog.py (versions: the database), registry.py (the
upload / resolve / list / delete the routes call).

Import the module you need: this file imports nothing, so loading one piece (the config) does
not load the rest (the ledger, SQLAlchemy).
"""
