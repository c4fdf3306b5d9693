import re
from datetime import datetime, timezone

_PERIOD = re.compile(r"^(\d{4})-(0[1-9]|1[0-2])$")


def month_bounds(t: datetime) -> tuple[datetime, datetime]:
    """The UTC month `t` falls in: [its first instant, the next month's first instant). The one
    month rule: periods, the usage routes' default range and the monthly token budget use it.
    A naive `t` is UTC. December 9999 ends at datetime.max (no later instant exists)."""
    t = t.replace(tzinfo=timezone.utc) if t.tzinfo is None else t.astimezone(timezone.utc)
    start = datetime(t.year, t.month, 1, tzinfo=timezone.utc)
    if t.year == 9999 and t.month == 12:
        return start, datetime.max.replace(tzinfo=timezone.utc)
    return start, datetime(t.year + t.month // 12, t.month % 12 + 1, 1, tzinfo=timezone.utc)


def period_bounds(period: str) -> tuple[datetime, datetime]:
    """'YYYY-MM' -> [first instant of the month, first instant of the next) in UTC."""
    m = _PERIOD.match(period)
    if not m:
        raise ValueError(f"period {period!r} is not YYYY-MM")
    if period == "9999-12":
        raise ValueError("period '9999-12' has no end a datetime can hold; the last is 9999-11")
    return month_bounds(datetime(int(m[1]), int(m[2]), 1, tzinfo=timezone.utc))


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
