"""One module per scenario of `python -m bench` (bench/cli.py lists them)."""
