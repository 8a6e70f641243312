"""The content-quality layer: what a catalogue should say of a dataset and did not. Warnings
only: a record that has them is stored all the same (domain/outcomes.py).

It reads the CKAN-shaped package every kind of source maps its records to (domain/dataset.py,
``package_record``), so every kind of portal is held to the same few expectations:

- ``no-description``: no description (after HTML is stripped);
- ``no-license``: no licence named;
- ``no-distribution``: no resource, file or link;
- ``modified-in-future``: a modification date later than now (a day of slack for time zones);
- ``landing-page-not-http``: a landing page (the package's ``url``) that is not http(s);
- ``bad-optional-date``: an ``issued`` date that cannot be read as a date.

Pure: ``now`` is given (the caller's clock).
"""
from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any, Mapping

from harvester.domain.outcomes import Problem, problem

FUTURE_SLACK = timedelta(days=1)


def _blank(value: Any) -> bool:
    return value is None or (isinstance(value, str) and not value.strip()) or value in ([], {})


def content_warnings(pkg: Mapping, *, description: str, modified: datetime | None, parse_date,
                     landing_page: bool = True, now: datetime | None = None) -> tuple[Problem, ...]:
    """The warnings of a package. ``description``: its cleaned description; ``modified``: its
    parsed modification time (aware, UTC; None when it has none); ``parse_date``: the parser of
    record dates (domain.dataset.parse_timestamp: None when a text is not a date);
    ``landing_page``: whether the package's ``url`` is its landing page (a CKAN package's is its
    free-text "source" field: the landing page is the portal's own dataset page)."""
    now = now or datetime.now(timezone.utc)
    out = []
    if not description:
        out.append(problem("no-description", "the dataset has no description", "description"))
    if _blank(pkg.get("license_id")) and _blank(pkg.get("license_title")):
        out.append(problem("no-license", "the dataset names no licence", "license"))
    resources = pkg.get("resources")
    if not isinstance(resources, list) or not resources:
        out.append(problem("no-distribution", "the dataset has no distribution", "distribution"))
    if modified is not None and modified > now + FUTURE_SLACK:
        out.append(problem("modified-in-future", f"modified is {modified.isoformat()}, later than now",
                           "modified", pkg.get("metadata_modified")))
    url = pkg.get("url")
    if landing_page and isinstance(url, str) and url.strip() and not url.strip().lower().startswith(("http://", "https://")):
        out.append(problem("landing-page-not-http", f"the landing page {url.strip()[:100]!r} is not an http(s) URL",
                           "landingPage", url))
    issued = pkg.get("issued", pkg.get("metadata_created"))
    if isinstance(issued, str) and issued.strip() and parse_date(issued) is None and not _iso_partial(issued):
        out.append(problem("bad-optional-date", f"issued {issued.strip()[:60]!r} is not a date", "issued", issued))
    return tuple(out)


def _iso_partial(text: str) -> bool:
    """A year or a year and month alone (``2019``, ``2019-05``): a date, of lower precision."""
    text = text.strip()
    parts = text.split("-")
    return 1 <= len(parts) <= 2 and all(p.isdigit() for p in parts) and len(parts[0]) == 4
