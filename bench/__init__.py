"""Benchmark and comparison code that the serving package (platform/loraplex) does not ship.

Importable with the repository root on sys.path: scripts/ put it there, pytest's config does
(`pythonpath`), and python -m bench routing hands it to its Serve replicas (PYTHONPATH).
"""
