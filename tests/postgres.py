"""Throwaway PostgreSQL databases for tests and benchmarks (the local Debian cluster, started here
as root if it is down, or LORAPLEX_TEST_PG_ADMIN_URL). Test-only: it may run `su postgres`."""
import contextlib
import fcntl
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Iterator

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ProgrammingError

ROLE = "loraplex_test"
PASSWORD = "loraplex_test"
LOCAL_ADMIN_URL = f"postgresql+psycopg://{ROLE}:{PASSWORD}@127.0.0.1:5432/postgres"


# Held exclusively while a test has stopped the local cluster on purpose (the outage drill);
# _local_cluster takes it shared before starting a cluster it found down, so another test on the
# machine waits for the drill to end instead of starting PostgreSQL in the middle of its outage.
STOPPED_ON_PURPOSE_LOCK = Path(tempfile.gettempdir()) / "loraplex-test-postgres-stopped.lock"


class PostgresUnavailable(RuntimeError):
    pass


@contextlib.contextmanager
def stopped_on_purpose() -> Iterator[None]:
    """Hold while the local cluster is stopped on purpose: no other test here starts it meanwhile."""
    with open(STOPPED_ON_PURPOSE_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@contextlib.contextmanager
def throwaway_postgres() -> Iterator[str]:
    """Yield the URL of a fresh database; drop it afterwards. Raises PostgresUnavailable."""
    admin_url = os.environ.get("LORAPLEX_TEST_PG_ADMIN_URL") or _local_cluster()
    name = f"loraplex_t_{uuid.uuid4().hex[:12]}"
    # pre_ping: the outage drill restarts the cluster under this engine; its pooled connection is then dead.
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT", pool_pre_ping=True)
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    except Exception as e:  # noqa: BLE001 - any failure means "no Postgres here"
        admin.dispose()
        raise PostgresUnavailable(f"cannot create a database via {admin_url}: {e}") from e
    try:
        yield make_url(admin_url).set(database=name).render_as_string(hide_password=False)
    finally:
        try:
            _drop(admin, name)
        finally:
            admin.dispose()


def _drop(admin, name: str, attempts: int = 5) -> None:
    # FORCE may not signal a backend it does not own (an autovacuum worker that just started on
    # the database): that is transient, so wait a moment and try again.
    for attempt in range(attempts):
        try:
            with admin.connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            return
        except ProgrammingError:
            if attempt == attempts - 1:
                raise
            time.sleep(0.5)


def _local_cluster() -> str:
    if os.environ.get("LORAPLEX_TEST_PG", "1") == "0":
        raise PostgresUnavailable("LORAPLEX_TEST_PG=0")
    if _can_connect(LOCAL_ADMIN_URL):
        return LOCAL_ADMIN_URL
    with open(STOPPED_ON_PURPOSE_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_SH)  # a drill that stopped the cluster starts it again itself
        if _can_connect(LOCAL_ADMIN_URL):
            return LOCAL_ADMIN_URL
        return _start_local_cluster()


def _start_local_cluster() -> str:
    if os.geteuid() != 0 or not shutil.which("pg_ctlcluster") or not shutil.which("pg_lsclusters"):
        raise PostgresUnavailable("no reachable PostgreSQL and no local cluster we may start (need root + pg_ctlcluster)")
    clusters = subprocess.run(["pg_lsclusters", "-h"], capture_output=True, text=True).stdout.split()
    if len(clusters) < 2:
        raise PostgresUnavailable("pg_lsclusters shows no cluster")
    version, cluster = clusters[0], clusters[1]
    subprocess.run(["pg_ctlcluster", version, cluster, "start"], capture_output=True, text=True)
    sql = (f"DO $$BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname='{ROLE}') THEN "
           f"CREATE ROLE {ROLE} LOGIN CREATEDB PASSWORD '{PASSWORD}'; END IF; END$$;")
    # SQL on stdin: `su -c` runs a shell that would expand the $$ quotes.
    r = subprocess.run(["su", "postgres", "-c", "psql -v ON_ERROR_STOP=1 -q"],
                       input=sql, capture_output=True, text=True)
    if r.returncode != 0:
        raise PostgresUnavailable(f"could not create role {ROLE}: {r.stderr.strip()}")
    if not _can_connect(LOCAL_ADMIN_URL):
        raise PostgresUnavailable(f"started cluster {version}/{cluster} but cannot connect to {LOCAL_ADMIN_URL}")
    return LOCAL_ADMIN_URL


def _can_connect(url: str) -> bool:
    engine = create_engine(url, connect_args={"connect_timeout": 3})
    try:
        with engine.connect():
            return True
    except Exception:  # noqa: BLE001
        return False
    finally:
        engine.dispose()
