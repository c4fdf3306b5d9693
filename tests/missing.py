"""skip_or_fail: what a test does when something it needs (PostgreSQL, moto, the model) is missing."""

import os

import pytest


def in_ci() -> bool:
    return bool(os.environ.get("CI"))


def skip_or_fail(reason: str) -> None:
    """A skip with the reason locally; a failure where the env var CI is set (CI must not skip)."""
    if in_ci():
        pytest.fail(f"{reason} (CI is set: a missing dependency fails instead of skipping)", pytrace=False)
    pytest.skip(reason)
