"""What the commands' options take: portals by name, dates, counts."""
from __future__ import annotations

import argparse

from harvester.config import portals as portal_config
from harvester.domain.dates import parse_user_date


def portal(name: str | None):
    """The portal of portals.yaml named ``name`` (None for none); LookupError naming it otherwise."""
    return None if name is None else portal_config.get_portal(name)


def portal_url(name: str | None) -> str | None:
    found = portal(name)
    return found.url if found else None


def _date(text: str, end: bool):
    try:
        return parse_user_date(text, end=end)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def date_from(text: str):
    """A --since-like option: a date (its first instant) or a date and time, UTC unless given."""
    return _date(text, end=False)


def date_until(text: str):
    """An --until-like option: a date (its whole day, to its last instant) or a date and time."""
    return _date(text, end=True)


def positive_float(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        number = 0.0
    if not number > 0 or number == float("inf"):
        raise argparse.ArgumentTypeError(f"{value!r} must be a number of seconds above 0")
    return number


def positive_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise argparse.ArgumentTypeError(f"{value!r} must be a whole number of at least 1")
    return number
