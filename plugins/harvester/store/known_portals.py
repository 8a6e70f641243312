"""The portals the database knows: every portal a run was recorded for, by name and URL.

portals.yaml is one Airflow deployment's list; the database may hold more (a portal harvested from
the CLI, one removed from portals.yaml, the demo's). The CLI and the Harvester page find a portal
here by the name its runs recorded, so a name shown anywhere leads somewhere.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True)
class KnownPortal:
    name: str
    url: str
    last_run_at: datetime


def known_portals(conn) -> list[KnownPortal]:
    """Every portal with a run, by name, then the most recently run first; one row per URL, named
    as its latest run recorded it."""
    rows = conn.execute(
        """
        SELECT DISTINCT ON (portal_url) portal_name, portal_url, started_at
        FROM sync_runs ORDER BY portal_url, started_at DESC, run_id DESC
        """).fetchall()
    found = [KnownPortal(name, url, started) for name, url, started in rows]
    return sorted(found, key=lambda p: (p.name, -p.last_run_at.timestamp()))


def portals_named(conn, name: str) -> list[KnownPortal]:
    """The portals whose latest run recorded the name ``name``, the most recently run first (a name
    can outlive a move: the same portal at a new URL)."""
    return [p for p in known_portals(conn) if p.name == name]
