"""scripts/bench_stream.py's pieces: the streaming client, the bare floors, the platform, the report."""
