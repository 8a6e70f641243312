"""What the example consumer DAG (dags/review_changes.py) does: log the changes needing review
of the harvest runs whose Asset events triggered it."""
from __future__ import annotations

import logging

log = logging.getLogger(__name__)


# The counts of a harvest event's extra that say whether its run has anything to look at.
_CHANGE_KEYS = ("created", "updated", "removed", "review")


def _has_changes(extra: dict) -> bool:
    """A change or a review in the run; an event without the counts may have them too."""
    return not any(k in extra for k in _CHANGE_KEYS) or any(extra.get(k) for k in _CHANGE_KEYS)


def run_ids(triggering_asset_events, *, with_changes: bool = False) -> list[int]:
    """The harvest run ids carried by the triggering events' extra (``with_changes``: only of the
    runs that changed something or have something to review)."""
    ids = []
    for events in (triggering_asset_events or {}).values():
        for event in events:
            extra = getattr(event, "extra", None) or {}
            run_id = extra.get("run_id")
            if isinstance(run_id, int) and (not with_changes or _has_changes(extra)):
                ids.append(run_id)
    return sorted(set(ids))


def log_changes_needing_review(conn, ids: list[int]) -> int:
    """Log each change of the runs ``ids`` that requires review (most significant first), then
    how many there are; returns that count."""
    from harvester.config.secrets import redact_url
    from harvester.store import review

    rows = review.needing_review(conn, ids)
    for change_type, score, title, url, portal_url in rows:
        log.warning("REVIEW %s (%.0f%%): %s %s [%s]", change_type.upper(), float(score) * 100, title, url,
                    redact_url(portal_url))
    log.info("%d changes need review in runs %s", len(rows), ids)
    return len(rows)


def log_triggering_changes(context) -> dict:
    from harvester.store import db

    events = context.get("triggering_asset_events")
    ids, changed = run_ids(events), run_ids(events, with_changes=True)
    if not changed:
        log.info("nothing to do: %s", f"harvest runs {ids} changed nothing and have nothing to review" if ids
                 else "no harvest run among the triggering events")
        return {"runs": len(ids), "review": 0}
    if len(changed) < len(ids):
        log.info("skipping runs %s: they changed nothing and have nothing to review",
                 sorted(set(ids) - set(changed)))
    conn = db.open_task()
    try:
        return {"runs": len(ids), "review": log_changes_needing_review(conn, changed)}
    finally:
        conn.close()
