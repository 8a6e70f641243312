"""What the example consumer DAG (dags/review_changes.py) does: log the changes needing review
of the harvest runs whose Asset events triggered it."""
from __future__ import annotations

import logging

log = logging.getLogger(__name__)


def run_ids(triggering_asset_events) -> list[int]:
    """The harvest run ids carried by the triggering events' extra."""
    ids = []
    for events in (triggering_asset_events or {}).values():
        for event in events:
            run_id = (getattr(event, "extra", None) or {}).get("run_id")
            if isinstance(run_id, int):
                ids.append(run_id)
    return sorted(set(ids))


def log_changes_needing_review(conn, ids: list[int]) -> int:
    rows = conn.execute(
        "SELECT c.change_type, c.significance_score, d.title, d.url, d.portal_url FROM dataset_changes c"
        " JOIN datasets d ON d.id = c.dataset_id WHERE c.run_id = ANY(%s) AND c.requires_review"
        " ORDER BY c.significance_score DESC, c.id", (ids,)).fetchall()
    for change_type, score, title, url, portal_url in rows:
        log.warning("REVIEW %s (%.0f%%): %s %s [%s]", change_type.upper(), float(score) * 100, title, url, portal_url)
    log.info("%d changes need review in runs %s", len(rows), ids)
    return len(rows)


def log_triggering_changes(context) -> dict:
    from .store import db

    ids = run_ids(context.get("triggering_asset_events"))
    conn = db.open_task()
    try:
        return {"runs": len(ids), "review": log_changes_needing_review(conn, ids)}
    finally:
        conn.close()
