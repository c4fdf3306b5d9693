"""scripts/bench_ingress.py's pieces: the open-loop and burst loads of short streamed requests."""
