"""Reviewing detected changes (sql/006_review.sql): the review queue and the review action.

A change that requires review (``requires_review``) waits in the queue until someone marks it
reviewed or dismisses it; either records who, when and an optional note, once: a change already
reviewed is not reviewed again (AlreadyReviewed names by whom and when). Any change may be
reviewed, also one that did not require it. The Harvester page in the Airflow UI
(harvester.ui.app) and ``harvester review`` (the CLI) both go through ``review``.
"""
from __future__ import annotations

from datetime import datetime

OUTCOMES = ("reviewed", "dismissed")
NOTE_MAX = 2000


class AlreadyReviewed(RuntimeError):
    """The change has a review already; the message says which, by whom and when."""

    def __init__(self, change_id: int, outcome: str, by: str, at: datetime):
        self.change_id, self.outcome, self.by, self.at = change_id, outcome, by, at
        super().__init__(f"change {change_id} was already {outcome} by {by} at "
                         f"{at.isoformat(timespec='seconds')}")


def _checked(outcome: str, by: str | None, note: str | None) -> tuple[str, str | None]:
    """Who reviewed and the note, trimmed; ValueError for a bad outcome, no name or too long a note."""
    if outcome not in OUTCOMES:
        raise ValueError(f"outcome {outcome!r} must be one of {', '.join(OUTCOMES)}")
    by = (by or "").strip()
    if not by:
        raise ValueError("a review needs the name of who made it")
    note = (note or "").strip() or None
    if note is not None and len(note) > NOTE_MAX:
        raise ValueError(f"the note has {len(note)} characters; at most {NOTE_MAX} are kept")
    return by, note


def review(conn, change_id: int, *, outcome: str, by: str, note: str | None = None) -> None:
    """Record a review of change ``change_id``: ``outcome`` ('reviewed' or 'dismissed'), who, now,
    and an optional note. One statement: of two reviewers at once, one wins and the other gets
    AlreadyReviewed. LookupError for an unknown change, ValueError for a bad outcome or name."""
    by, note = _checked(outcome, by, note)
    row = conn.execute(
        """
        WITH done AS (
            UPDATE dataset_changes SET review_outcome = %(outcome)s, reviewed_by = %(by)s, review_note = %(note)s,
                reviewed_at = now()
            WHERE id = %(id)s AND review_outcome IS NULL
            RETURNING id
        )
        SELECT (SELECT count(*) FROM done), c.id IS NOT NULL
        FROM (VALUES (1)) AS one (x) LEFT JOIN dataset_changes c ON c.id = %(id)s
        """, {"id": change_id, "outcome": outcome, "by": by, "note": note}).fetchone()
    updated, exists = row
    if updated:
        return
    if not exists:
        raise LookupError(f"no change with id {change_id}")
    # The statement's snapshot predates a review that won the race: read the review as it is now.
    old = conn.execute("SELECT review_outcome, reviewed_by, reviewed_at FROM dataset_changes WHERE id = %s",
                       (change_id,)).fetchone()
    raise AlreadyReviewed(change_id, *old)


def queue_counts(conn, portal_urls: list[str]) -> dict[str, int]:
    """Per portal URL: how many of its changes wait for review (portals with none are left out)."""
    rows = conn.execute(
        "SELECT d.portal_url, count(*) FROM dataset_changes c JOIN datasets d ON d.id = c.dataset_id"
        " WHERE c.requires_review AND c.review_outcome IS NULL AND d.portal_url = ANY(%s)"
        " GROUP BY d.portal_url", (list(portal_urls),)).fetchall()
    return {url: int(n) for url, n in rows}


def needing_review(conn, run_ids: list[int]) -> list[tuple]:
    """The changes of the runs ``run_ids`` that require review, most significant first, as
    (change type, significance score, dataset title, dataset url, portal url) rows."""
    return conn.execute(
        "SELECT c.change_type, c.significance_score, d.title, d.url, d.portal_url FROM dataset_changes c"
        " JOIN datasets d ON d.id = c.dataset_id WHERE c.run_id = ANY(%s) AND c.requires_review"
        " ORDER BY c.significance_score DESC, c.id", (list(run_ids),)).fetchall()


def count_needing_review(conn, run_id: int) -> int:
    """How many changes of run ``run_id`` require review."""
    return int(conn.execute("SELECT count(*) FROM dataset_changes WHERE run_id = %s AND requires_review",
                            (run_id,)).fetchone()[0])


MANY_MAX = 500  # changes one bulk review may name: a page of the changes list at its largest


def change_portals(conn, change_ids: list[int]) -> dict[int, tuple[str, str | None]]:
    """Per change id that exists: (its dataset's portal URL, the portal's name as its runs recorded it)."""
    rows = conn.execute(
        "SELECT c.id, d.portal_url, p.portal_name FROM dataset_changes c JOIN datasets d ON d.id = c.dataset_id"
        " LEFT JOIN portal_sync_status p ON p.portal_url = d.portal_url WHERE c.id = ANY(%s)",
        (list(change_ids),)).fetchall()
    return {cid: (url, name) for cid, url, name in rows}


def review_many(conn, change_ids: list[int], *, outcome: str, by: str, note: str | None = None) -> list[int]:
    """Record one review (``outcome``, who, now, the note) of every change of ``change_ids`` that
    has none yet, in one statement; the ids it marked. Changes reviewed already (before, or by
    someone else at the same moment) keep their review and are not among the ids. ValueError for
    a bad outcome, name, note or too many ids."""
    by, note = _checked(outcome, by, note)
    ids = sorted(set(change_ids))
    if len(ids) > MANY_MAX:
        raise ValueError(f"{len(ids)} changes named; at most {MANY_MAX} are reviewed at once")
    rows = conn.execute(
        "UPDATE dataset_changes SET review_outcome = %(outcome)s, reviewed_by = %(by)s, review_note = %(note)s,"
        " reviewed_at = now() WHERE id = ANY(%(ids)s) AND review_outcome IS NULL RETURNING id",
        {"ids": ids, "outcome": outcome, "by": by, "note": note}).fetchall()
    return sorted(r[0] for r in rows)
