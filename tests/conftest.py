"""Suite-wide rules. With the env var CI set, a skip is a failure: CI must never go green on a
machine that lacks PostgreSQL, moto, the model or a test dependency (.ci/run also checks that
pytest reports 0 skipped). Without CI, a skip stays a skip, with its reason (-rs)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/: shared helpers (waiting, postgres, ...)
from missing import in_ci  # noqa: E402


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if in_ci() and report.skipped and not hasattr(report, "wasxfail"):
        # Any skip (pytest.skip, importorskip, a skipif mark) is a failure in CI.
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped in CI, which must not skip: {reason}"


def pytest_collection_finish(session):
    """Tests on the real engine upload the demo adapters: on a fresh checkout, train them on one
    thread while the unit tests (collected first, one core) run, not in the first test that needs them."""
    if not session.config.option.collectonly and any("tests/unit/" not in item.nodeid for item in session.items):
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: bench/
        from bench.demo_adapters import recipes, train_in_background
        train_in_background(recipes())

