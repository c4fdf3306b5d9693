from datetime import datetime, timezone

from sqlalchemy import DateTime
from sqlalchemy.types import TypeDecorator


class UTCDateTime(TypeDecorator):
    """Aware UTC datetimes in Python, naive UTC in the column.

    Naive storage makes SQLite (text) and Postgres (timestamp) behave the same, and keeps
    date_trunc / strftime bucketing independent of the session time zone.
    """

    impl = DateTime(timezone=False)
    cache_ok = True

    def process_bind_param(self, value, dialect):
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r}: pass an aware UTC datetime")
        return value.astimezone(timezone.utc).replace(tzinfo=None)

    def process_result_value(self, value, dialect):
        if value is None:
            return None
        if isinstance(value, str):  # raw SQLite text, e.g. from a func expression
            value = datetime.fromisoformat(value)
        return value.replace(tzinfo=timezone.utc)
