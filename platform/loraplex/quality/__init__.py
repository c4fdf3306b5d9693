"""Quality runs (issue 52): a tenant's own requests run on a reference model and a candidate (a
cheaper base, or the same adapter on one), compared, and a verdict against thresholds; and the
gate that keeps an adapter off a base it was not trained on until such a run passed.

config.py (QualityConfig), metrics.py (the figures of one line and of a run), verdict.py (figures
against thresholds), gate.py (who needs a passing run), lines.py (the quality file and the batch
lines a run sends), tables.py / repository.py (runs and overrides), runner.py (drives a run
through the Batch API's runner).

Import the module you need: this file imports nothing.
"""
