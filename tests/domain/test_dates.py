"""Dates a user types: one reading for the CLI, the API and search filters (pure)."""
from datetime import date, datetime, timedelta, timezone

import pytest

from harvester.domain.dates import as_instant, parse_user_date

UTC = timezone.utc
MESSAGE = "is not a date: use YYYY-MM-DD or YYYY-MM-DDTHH:MM[:SS][Z|+HH:MM] (UTC unless a zone is given)"


@pytest.mark.parametrize("text, start, end", [
    ("2024-05-31", datetime(2024, 5, 31, tzinfo=UTC), datetime(2024, 5, 31, 23, 59, 59, 999999, tzinfo=UTC)),
    ("  2024-05-31\n", datetime(2024, 5, 31, tzinfo=UTC), datetime(2024, 5, 31, 23, 59, 59, 999999, tzinfo=UTC)),
    ("2024-05-31T10:20", datetime(2024, 5, 31, 10, 20, tzinfo=UTC), datetime(2024, 5, 31, 10, 20, tzinfo=UTC)),
    ("2024-05-31T10:20:30Z", datetime(2024, 5, 31, 10, 20, 30, tzinfo=UTC),
     datetime(2024, 5, 31, 10, 20, 30, tzinfo=UTC)),
    ("2024-05-31 10:20", datetime(2024, 5, 31, 10, 20, tzinfo=UTC), datetime(2024, 5, 31, 10, 20, tzinfo=UTC)),
])
def test_a_date_is_its_whole_day_and_a_time_is_utc_unless_given(text, start, end):
    assert parse_user_date(text) == start and parse_user_date(text).tzinfo == UTC
    assert parse_user_date(text, end=True) == end


def test_a_given_zone_is_kept():
    value = parse_user_date("2024-05-31T10:00:00+02:00", end=True)
    assert value.utcoffset() == timedelta(hours=2) and value == datetime(2024, 5, 31, 8, tzinfo=UTC)


@pytest.mark.parametrize("text", ["yesterday", "", "   ", "2024-13-01", "2024-05-31T25:00", "31/05/2024"])
def test_anything_else_is_refused_naming_the_text_and_the_forms(text):
    with pytest.raises(ValueError) as raised:
        parse_user_date(text)
    assert str(raised.value) == f"{text!r} {MESSAGE}"


def test_as_instant_of_dates_and_datetimes():
    assert as_instant(date(2021, 12, 31)) == datetime(2021, 12, 31, tzinfo=UTC)
    assert as_instant(date(2021, 12, 31), end=True) == datetime(2022, 1, 1, tzinfo=UTC) - timedelta(microseconds=1)
    assert as_instant(datetime(2021, 12, 31, 8)) == datetime(2021, 12, 31, 8, tzinfo=UTC)
    aware = datetime(2021, 12, 31, 8, tzinfo=timezone(timedelta(hours=-3)))
    assert as_instant(aware, end=True) is aware
    with pytest.raises(TypeError, match="expected a date or datetime, got '2021-12-31'"):
        as_instant("2021-12-31")
