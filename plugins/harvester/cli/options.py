"""What the commands' options take: portals by name, dates, counts."""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from harvester.config import portals as portal_config
from harvester.domain.dates import parse_user_date


def portal(name: str | None):
    """The portal of portals.yaml named ``name`` (None for none); LookupError naming it otherwise."""
    return None if name is None else portal_config.get_portal(name)


@dataclass(frozen=True)
class NamedPortal:
    """A portal a command was given by name: portals.yaml's, or one the database's runs recorded."""

    name: str
    url: str


def find_portal(conn, name: str | None) -> NamedPortal | None:
    """The portal named ``name`` (None for none): portals.yaml's first, else the one whose latest run
    recorded that name (store/known_portals.py: the demo's, one harvested from another portals file,
    one since removed from it; the most recently run when several URLs had it). PortalConfigError
    naming both places and what each knows when neither has it."""
    if name is None:
        return None
    path = portal_config.portals_file()
    try:
        configured = portal_config.load_portals(path)
    except portal_config.PortalConfigError:
        if Path(path).exists():
            raise  # a broken portals.yaml is an error, not a reason to look elsewhere
        configured = []
    for found in configured:
        if found.name == name:
            return NamedPortal(found.name, found.url)
    from harvester.store.known_portals import known_portals

    known = known_portals(conn)
    named = [p for p in known if p.name == name]
    if named:
        return NamedPortal(named[0].name, named[0].url)
    in_file = ", ".join(p.name for p in configured) or "none"
    in_db = ", ".join(dict.fromkeys(p.name for p in known)) or "none"
    raise portal_config.PortalConfigError(
        f"no portal named {name!r} in {path} (known there: {in_file}) or in the database's runs (known there: "
        f"{in_db}); set HARVESTER_PORTALS_FILE for another portals file")


def find_portal_url(conn, name: str | None) -> str | None:
    """The URL of the portal named ``name`` (find_portal), None for none."""
    found = find_portal(conn, name)
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
