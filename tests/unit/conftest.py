import contextlib

import pytest

from loraplex.db.testing import PostgresUnavailable, throwaway_postgres


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request, tmp_path):
    """Database tests run on a SQLite file and on a throwaway PostgreSQL database (skipped, with
    the reason, where no PostgreSQL server can be started)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/loraplex.db"
        return
    with contextlib.ExitStack() as stack:
        try:
            url = stack.enter_context(throwaway_postgres())
        except PostgresUnavailable as e:
            pytest.skip(f"PostgreSQL not available: {e}")
        yield url
