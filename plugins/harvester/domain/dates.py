"""Dates a user types (CLI options, API query parameters): one reading and one error message. Pure: no IO."""
from __future__ import annotations

from datetime import date, datetime, time, timedelta, timezone

FORMS = "YYYY-MM-DD or YYYY-MM-DDTHH:MM[:SS][Z|+HH:MM] (UTC unless a zone is given)"
_LAST_INSTANT = timedelta(days=1, microseconds=-1)


def as_instant(value: date | datetime, end: bool = False) -> datetime:
    """``value`` as a timezone-aware instant: a date is its day in UTC, its first instant, or with
    ``end`` its last (23:59:59.999999, so that "until a date" takes that whole day); a datetime
    without a zone is UTC; one with a zone keeps it."""
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=timezone.utc)
    if isinstance(value, date):
        start = datetime.combine(value, time(0), tzinfo=timezone.utc)
        return start + _LAST_INSTANT if end else start
    raise TypeError(f"expected a date or datetime, got {value!r}")


def parse_user_date(text: str, end: bool = False) -> datetime:
    """The instant ``text`` names: a date alone (YYYY-MM-DD: its whole day, see ``as_instant`` for
    ``end``) or an ISO 8601 date and time. ValueError naming the text and the accepted forms."""
    cleaned = text.strip() if isinstance(text, str) else ""
    try:
        value = date.fromisoformat(cleaned)
    except ValueError:
        try:
            value = datetime.fromisoformat(cleaned)
        except ValueError:
            raise ValueError(f"{text!r} is not a date: use {FORMS}") from None
    return as_instant(value, end=end)
