"""scripts/bench_overload.py's pieces: workload, client and load loops, phases, tables, checks."""
