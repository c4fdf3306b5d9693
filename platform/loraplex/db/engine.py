import contextlib
from pathlib import Path

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.orm import sessionmaker

DEFAULT_DB_URL = "sqlite:///var/loraplex.db"
SQLITE_BUSY_TIMEOUT_MS = 5000
# A dead or unreachable PostgreSQL must fail a request fast (it then answers 503, or is served
# from the ingress's key cache), never hang it: a new connection gives up after
# CONNECT_TIMEOUT_S, a request waiting for a pooled one after POOL_TIMEOUT_S. pool_pre_ping
# tests every pooled connection before use and replaces the ones a restart or failover broke,
# so the pools recover on their own; nothing retries a query (the caller gets 503 + Retry-After,
# the usage ledger's flusher backs off and retries, the key cache's refresher retries each period).
CONNECT_TIMEOUT_S = 3
POOL_TIMEOUT_S = 5


def make_engine(url: str = DEFAULT_DB_URL, **kwargs) -> Engine:
    """Engine for a SQLite file (WAL, busy_timeout) or Postgres (psycopg 3) URL."""
    u = make_url(url)
    if u.get_backend_name() == "postgresql":
        if u.drivername == "postgresql":  # psycopg2 is not a dependency; psycopg 3 is
            u = u.set(drivername="postgresql+psycopg")
        kwargs.setdefault("pool_pre_ping", True)
        kwargs.setdefault("pool_timeout", POOL_TIMEOUT_S)
        kwargs.setdefault("connect_args", {"connect_timeout": CONNECT_TIMEOUT_S})
        return create_engine(u, **kwargs)
    if u.get_backend_name() != "sqlite":
        raise ValueError(f"unsupported database URL {url!r}: use sqlite:/// or postgresql://")
    if u.database and u.database != ":memory:":
        Path(u.database).parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(u, **kwargs)
    _tune_sqlite(engine)
    return engine


def _tune_sqlite(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def on_connect(dbapi_conn, _record):
        # pysqlite's implicit BEGIN skips DDL and SELECT; take over so transactions are real.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")  # readers never block the ledger's writer
        cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        # FULL: a commit survives power loss; the ledger deletes spool segments right after it.
        cur.execute("PRAGMA synchronous=FULL")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.close()

    @event.listens_for(engine, "begin")
    def on_begin(conn):
        # Writers that read first (migrations) ask for IMMEDIATE to avoid SQLITE_BUSY_SNAPSHOT.
        conn.exec_driver_sql(conn.get_execution_options().get("sqlite_begin", "BEGIN"))


@contextlib.contextmanager
def write_transaction(engine: Engine):
    """A transaction that reads and then writes. On SQLite it starts with BEGIN IMMEDIATE: a
    deferred one that read first fails at once with "database is locked" (SQLITE_BUSY_SNAPSHOT)
    when another connection, such as the usage ledger's flusher, committed meanwhile. Postgres
    ignores the option."""
    with engine.connect().execution_options(sqlite_begin="BEGIN IMMEDIATE") as conn, conn.begin():
        yield conn


def session_factory(engine: Engine) -> sessionmaker:
    return sessionmaker(engine, expire_on_commit=False)
