import pytest

from loraplex.db.engine import make_engine
from loraplex.tenancy.service import TenantService




@pytest.fixture
def service(db_url):
    engine = make_engine(db_url)
    yield TenantService(engine)
    engine.dispose()  # Postgres cannot drop a database with open connections
