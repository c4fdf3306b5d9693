import re
from datetime import datetime, timezone

_PERIOD = re.compile(r"^(\d{4})-(0[1-9]|1[0-2])$")


def period_bounds(period: str) -> tuple[datetime, datetime]:
    """'YYYY-MM' -> [first instant of the month, first instant of the next) in UTC."""
    m = _PERIOD.match(period)
    if not m:
        raise ValueError(f"period {period!r} is not YYYY-MM")
    y, mo = int(m[1]), int(m[2])
    start = datetime(y, mo, 1, tzinfo=timezone.utc)
    end = datetime(y + mo // 12, mo % 12 + 1, 1, tzinfo=timezone.utc)
    return start, end


def check_range(start: datetime, end: datetime) -> None:
    if start.tzinfo is None or end.tzinfo is None:
        raise ValueError("start and end must be timezone-aware (UTC)")
    if not start < end:
        raise ValueError("start must be before end")


def parse_time(s: str) -> datetime:
    """ISO-8601 date or datetime from a query string; 'Z' accepted; naive means UTC."""
    t = datetime.fromisoformat(s.strip().replace("Z", "+00:00").replace(" ", "+"))  # '+' arrives as ' '
    try:
        return t.replace(tzinfo=timezone.utc) if t.tzinfo is None else t.astimezone(timezone.utc)
    except OverflowError:  # 0001-01-01T00:00+05:00 is before the year 1 in UTC
        raise ValueError(f"{s!r} is out of range in UTC (years 1 to 9999)") from None
