"""tests/browser.py: where Chromium or chromedriver is missing, a browser test is skipped with
the reason locally and fails where CI is set (CI must not go green without its browser tests)."""

import shutil

import pytest
from _pytest.outcomes import Failed, Skipped

import browser


@pytest.mark.parametrize("missing", ["chromium", "chromedriver"])
def test_a_missing_browser_fails_in_ci_and_skips_elsewhere(monkeypatch, missing):
    real = shutil.which
    monkeypatch.setattr(browser.shutil, "which", lambda name: None if name.startswith(missing) else real(name))
    monkeypatch.setenv("CI", "1")
    with pytest.raises(Failed, match="chromium-driver"):
        with browser.chromium():
            pass
    monkeypatch.delenv("CI")
    with pytest.raises(Skipped, match="not on PATH"):
        with browser.chromium():
            pass
