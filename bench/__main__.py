"""`python -m bench SCENARIO [options]` from the repository root: bench/cli.py."""

import sys

from bench.processes import ROOT

# This checkout's package first, wherever another checkout's loraplex is installed in the venv.
sys.path[:0] = [str(ROOT / "platform"), str(ROOT)]

if __name__ == "__main__":
    from bench.cli import main

    sys.exit(main())
