"""The Batch API (issue 36): JSONL files of OpenAI requests run from the online pool's idle
capacity, below every online request, billed at the plan's batch price.

config.py (BatchConfig), jsonl.py (input validation), state.py (a batch's states and counts),
tables.py (files, batches, lines), files.py (file bytes in the adapter store), repository.py
(the database side), runner.py (claims batches with a lease and runs their lines).

Import the module you need: this file imports nothing.
"""
