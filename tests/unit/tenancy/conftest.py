import contextlib

import pytest

from loraplex.db import make_engine
from loraplex.db.testing import PostgresUnavailable, throwaway_postgres
from loraplex.tenancy import TenantService


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request, tmp_path):
    """Every tenancy test runs on a SQLite file and on a throwaway PostgreSQL database."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/tenancy.db"
        return
    with contextlib.ExitStack() as stack:
        try:
            url = stack.enter_context(throwaway_postgres())
        except PostgresUnavailable as e:
            pytest.skip(f"PostgreSQL not available: {e}")
        yield url


@pytest.fixture
def service(db_url):
    engine = make_engine(db_url)
    yield TenantService(engine)
    engine.dispose()  # Postgres cannot drop a database with open connections
