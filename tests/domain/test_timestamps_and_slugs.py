"""The one parser of record timestamps (every source's formats) and the one organization slug."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from harvester.domain.dataset import parse_timestamp, sha256_hex, slug

UTC = timezone.utc


@pytest.mark.parametrize("value, expected", [
    ("2013-06-17T15:32:05.305546", datetime(2013, 6, 17, 15, 32, 5, 305546, tzinfo=UTC)),  # CKAN: UTC, no zone
    ("2019-09-30 22:00:00", datetime(2019, 9, 30, 22, tzinfo=UTC)),  # DKAN: a space for the T
    ("2020-01-01T00:00:00Z", datetime(2020, 1, 1, tzinfo=UTC)),
    ("2020-01-01T02:00:00+02:00", datetime(2020, 1, 1, tzinfo=UTC)),  # zoned: converted
    (" 2020-01-01 02:00:00+02:00\n", datetime(2020, 1, 1, tzinfo=UTC)),
    ("2020-01-01", datetime(2020, 1, 1, tzinfo=UTC)),  # DCAT: a date alone
    ("2020-01-01T00:00:00.123456789", datetime(2020, 1, 1, 0, 0, 0, 123456, tzinfo=UTC)),
    (datetime(2020, 1, 1, 12), datetime(2020, 1, 1, 12, tzinfo=UTC)),  # a datetime: naive is UTC
    (datetime(2020, 1, 1, 14, tzinfo=timezone(timedelta(hours=2))), datetime(2020, 1, 1, 12, tzinfo=UTC)),
])
def test_every_sources_timestamps_are_aware_utc(value, expected):
    parsed = parse_timestamp(value)
    assert parsed == expected and parsed.tzinfo == UTC


@pytest.mark.parametrize("value", [None, "", "   ", "not a date", "2020-13-01", "01/02/2020", 1577836800, b"2020-01-01"])
def test_what_is_not_a_timestamp_is_none(value):
    assert parse_timestamp(value) is None


@pytest.mark.parametrize("text, name", [
    ("Behörde für Umwelt und Energie (BUE)", "behorde-fur-umwelt-und-energie-bue"),
    ("  Ville de Montréal ", "ville-de-montreal"),
    ("Ministère de l'Économie, des Finances & de la Relance", "ministere-de-l-economie-des-finances-de-la-relance"),
    ("U.S. Commodity Futures Trading Commission", "u-s-commodity-futures-trading-commission"),
    ("ÅÆØ_123", "a-123"),  # Æ and Ø do not fold to ASCII: dropped
])
def test_a_slug_is_lower_case_ascii_letters_digits_and_dashes(text, name):
    assert slug(text) == name


def test_a_slug_is_at_most_100_characters_and_never_ends_in_a_dash():
    assert slug("a" * 99 + " b" + "c" * 50) == "a" * 99
    assert len(slug("word " * 40)) <= 100 and not slug("word " * 40).endswith("-")


def test_a_name_with_nothing_ascii_is_named_by_its_hash_whatever_its_padding():
    assert slug("東京都") == "org-" + sha256_hex("東京都")[:12]
    assert slug("  東京都\n") == slug("東京都") != slug("大阪府")
    assert slug("東京 都") == slug("東京  都") != slug("東京都")
    assert slug("") == slug("   ") == "org-" + sha256_hex("")[:12]
