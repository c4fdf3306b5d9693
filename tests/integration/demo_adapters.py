"""The demo adapters, trained once per recipe version and cached: bench/demo_adapters.py (shared
with python -m bench loadtest)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: bench/
from bench.demo_adapters import CACHE, ROOT, trained_adapter  # noqa: E402,F401
