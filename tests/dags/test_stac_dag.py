"""STAC catalogues (type: stac) through real Airflow (dag.test()), real HTTP to the local STAC server
(harvester.testing.stac_portal) and a real PostgreSQL. The collections are derived from the 41 real
ones recorded in ../shared/portal-samples/stac/ (FedEO, earth-search, the STAC 1.0/1.1 samples,
CBERS): new ids, numbered titles, ``updated`` a minute apart in 2024. STAC has no modified-since
filter, so every run lists every collection; what changed is found by the hashes."""
from __future__ import annotations

import logging
import math

import pytest

from harvester.testing.stac_portal import StacServer, derived_collections

PAGE = 100


@pytest.fixture(autouse=True)
def task_retries(monkeypatch):
    monkeypatch.setenv("HARVESTER_TASK_RETRIES", "2")
    monkeypatch.setenv("HARVESTER_TASK_RETRY_DELAY_SECS", "0")


def last_run(db):
    return db.execute("SELECT run_id, mode, status, stats, error FROM sync_runs ORDER BY run_id DESC LIMIT 1"
                      ).fetchone()


def live_ids(db) -> set[str]:
    return {r[0] for r in db.execute("SELECT source_id FROM datasets WHERE removed_at IS NULL").fetchall()}


def committed(harvest, db):
    assert harvest.run().state == "success"
    _, mode, status, stats, error = last_run(db)
    assert status == "committed", error
    return mode, stats


def test_an_api_of_hundreds_first_sync_then_only_what_changed_a_removal_and_faults_retried(harvest, db, gemini):
    collections = derived_collections(600)
    ids = {c["id"] for c in collections}
    with StacServer(collections, max_limit=PAGE) as stac:
        harvest.configure(stac.url, type="stac", page_size=1000, max_retries=3)   # capped at 100 a page
        mode, stats = committed(harvest, db)
        assert mode == "full" and live_ids(db) == ids
        assert (stats["created"], stats["failed"]) == (600, 0)
        assert stats["portal_requests"] == len(stac.requests) == 1 + math.ceil(600 / PAGE)  # landing + pages
        cbers = sorted(i for i in ids if i.startswith("CBERS4MUX"))[0]
        title, url, org = db.execute("SELECT title, url, organization FROM datasets WHERE source_id = %s",
                                     (cbers,)).fetchone()
        assert title == cbers and url == f"{stac.base_url}/collections/{cbers}"   # no title: its id
        assert org == "Instituto Nacional de Pesquisas Espaciais, INPE"

        # an edit of a title, one of an extent alone, a removal: the next run lists the same pages
        # and changes exactly those
        edited, moved, gone = sorted(ids)[10], sorted(ids)[300], sorted(ids)[550]
        stac.edit(edited, "2025-01-01T00:00:00Z", title="Edited collection")
        stac.edit(moved, extent={"spatial": {"bbox": [[0, 0, 1, 1]]}, "temporal": {"interval": [[None, None]]}})
        stac.remove(gone)
        stac.requests.clear()
        mode, stats = committed(harvest, db)
        assert (stats["created"], stats["updated"], stats["removed"], stats["failed"]) == (0, 2, 1, 0)
        assert stats["portal_requests"] == len(stac.requests) == 1 + math.ceil(599 / PAGE)
        assert live_ids(db) == ids - {gone}
        assert db.execute("SELECT title FROM datasets WHERE source_id = %s", (edited,)).fetchone()[0] == \
            "Edited collection"

        # transient faults are retried within the run; nothing changed, nothing written
        stac.fail_next(1, status=503)
        stac.fail_next(1, status=429, retry_after="0")
        stac.fail_next(1, truncate=True)
        stac.requests.clear()
        mode, stats = committed(harvest, db)
        assert (stats["created"], stats["updated"], stats["removed"]) == (0, 0, 0)
        assert stats["portal_requests"] == len(stac.requests) == 1 + math.ceil(599 / PAGE) + 3
        assert live_ids(db) == ids - {gone}


def test_hostile_answers_are_refused_and_nothing_is_lost(harvest, db, gemini, caplog, monkeypatch):
    caplog.set_level(logging.WARNING, logger="harvester")
    collections = derived_collections(300)
    ids = {c["id"] for c in collections}
    with StacServer(collections, paging="token", counts="context", static_group=40) as stac:
        # a static catalog of nested catalogs whose collections link the root back as a child
        stac.child_loop = True
        harvest.configure(stac.static_url, type="stac", page_size=PAGE, max_retries=2)
        mode, stats = committed(harvest, db)
        assert live_ids(db) == ids and (stats["created"], stats["failed"]) == (300, 0)
        assert len(stac.requests) == 1 + math.ceil(300 / 40) + 300    # each document once
        assert "a loop" in caplog.text

        # a child that cannot be read: the walk is incomplete, so the collection removed meanwhile
        # is not removed (nor the unread one)
        unread, gone = sorted(ids)[7], sorted(ids)[200]
        stac.missing_children = {unread}
        stac.remove(gone)
        mode, stats = committed(harvest, db)
        assert (stats["removed"], stats["failed"]) == (0, 0) and live_ids(db) == ids
        stac.missing_children = set()
        mode, stats = committed(harvest, db)
        assert stats["removed"] == 1 and live_ids(db) == ids - {gone}

        # the API's next link looping back: cut, nothing removed
        harvest.configure(stac.url, type="stac", page_size=PAGE, max_retries=2)
        stac.remove(sorted(ids)[250])
        stac.loop_after = 2
        caplog.clear()
        mode, stats = committed(harvest, db)
        assert (stats["removed"], stats["failed"]) == (0, 0) and live_ids(db) == ids - {gone}
        assert "already read" in caplog.text

        # a page that never ends: refused at the size cap, the run fails, nothing lost
        stac.loop_after = None
        stac.endless = True
        monkeypatch.setenv("HARVESTER_FETCH_MAX_BYTES", "1MB")
        dag_run = harvest.run()
        assert dag_run.state == "failed"
        _, _, status, _, error = last_run(db)
        assert status == "failed" and "larger than 1MB" in error, error
        assert live_ids(db) == ids - {gone}
