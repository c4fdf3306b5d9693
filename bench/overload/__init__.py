"""python -m bench overload's pieces: workload, client and load loops, phases, tables, checks."""
