import contextlib

import pytest

from loraplex.db.testing import PostgresUnavailable, throwaway_postgres


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request, tmp_path):
    """Every ledger/report test runs on a SQLite file and on a throwaway PostgreSQL database."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/ledger.db"
        return
    with contextlib.ExitStack() as stack:
        try:
            url = stack.enter_context(throwaway_postgres())
        except PostgresUnavailable as e:
            pytest.skip(f"PostgreSQL not available: {e}")
        yield url
