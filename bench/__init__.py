"""Benchmark and comparison code that the serving package (platform/loraplex) does not ship;
`python -m bench SCENARIO` runs each benchmark (bench/cli.py).

Importable with the repository root on sys.path: `python -m bench` from the root and scripts/bench
put it there, pytest's config does (`pythonpath`), and the routing scenario hands it to its Serve
replicas (PYTHONPATH).
"""
