"""Test files have unique basenames: the test tree has no __init__.py, so pytest imports each file
as a top-level module named after its basename, and a second file of the same name stops the
whole collection ("import file mismatch") on a clean clone."""
from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_test_file_basenames_are_unique():
    names = Counter(p.name for p in TESTS.rglob("test_*.py"))
    assert [n for n, c in names.items() if c > 1] == []
