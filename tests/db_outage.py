"""A database outage for unit tests: every new connection of a SQLAlchemy engine fails with
OperationalError (what psycopg raises when PostgreSQL is stopped), and the pooled ones are
dropped, until the block ends."""

from __future__ import annotations

import contextlib

from sqlalchemy import Engine, event


@contextlib.contextmanager
def outage(engine: Engine):
    def refuse(dialect, conn_rec, cargs, cparams):
        # The driver's own error (sqlite3's, psycopg's): SQLAlchemy wraps it as it would a real one.
        raise dialect.loaded_dbapi.OperationalError("connection refused (simulated database outage)")

    event.listen(engine, "do_connect", refuse)
    engine.dispose()
    try:
        yield
    finally:
        event.remove(engine, "do_connect", refuse)
