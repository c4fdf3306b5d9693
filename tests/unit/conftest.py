import contextlib
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: shared test helpers
from missing import skip_or_fail  # noqa: E402
from postgres import PostgresUnavailable, throwaway_postgres  # noqa: E402


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request, tmp_path):
    """Database tests run on a SQLite file and on a throwaway PostgreSQL database (skipped, with
    the reason, where no PostgreSQL server can be started; a failure where CI is set)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/loraplex.db"
        return
    with contextlib.ExitStack() as stack:
        try:
            url = stack.enter_context(throwaway_postgres())
        except PostgresUnavailable as e:
            skip_or_fail(f"PostgreSQL not available: {e}")
        yield url
