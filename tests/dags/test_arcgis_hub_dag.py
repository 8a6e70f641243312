"""ArcGIS Hub sites (type: arcgis-hub) through real Airflow (dag.test()), real HTTP to the local Hub
search server and a real PostgreSQL. The catalogue is the 47 datasets of a real Hub's DCAT-US feed
(tests/data/arcgis-hub/sce-drpep-hub-dcat-us-1.1.json) served as search features shaped like Esri's
recorded one; the ids expected are computed here from the feed itself."""
from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from harvester.testing.arcgis_hub_portal import ArcGisHubServer, features_from_dcat

DATA = Path(__file__).resolve().parents[1] / "data" / "arcgis-hub"
PAGE = 20


def feed() -> dict:
    return json.loads((DATA / "sce-drpep-hub-dcat-us-1.1.json").read_text())


def expected_ids() -> set[str]:
    """Hub ids from the feed: the item id, with ``_<layer>`` for a layer of a service."""
    out = set()
    for entry in feed()["dataset"]:
        query = parse_qs(urlsplit(entry["identifier"]).query)
        out.add(query["id"][0] + ("_" + query["sublayer"][0] if "sublayer" in query else ""))
    return out


@pytest.fixture
def hub():
    template = json.loads((DATA / "ogcItemsResponse.json").read_text())["features"][0]
    with ArcGisHubServer(features_from_dcat(feed(), template)) as server:
        yield server


@pytest.fixture(autouse=True)
def task_retries(monkeypatch):
    monkeypatch.setenv("HARVESTER_TASK_RETRIES", "2")
    monkeypatch.setenv("HARVESTER_TASK_RETRY_DELAY_SECS", "0")


def last_run(db):
    return db.execute("SELECT run_id, mode, status, stats, error FROM sync_runs ORDER BY run_id DESC LIMIT 1").fetchone()


def live_ids(db) -> set[str]:
    return {r[0] for r in db.execute("SELECT source_id FROM datasets WHERE removed_at IS NULL").fetchall()}


def first_sync(harvest, hub, db, **extra):
    harvest.configure(hub.url, type="arcgis-hub", page_size=PAGE, **extra)
    assert harvest.run().state == "success"
    _, mode, status, stats, _ = last_run(db)
    assert (mode, status) == ("full", "committed")
    return stats


def test_first_sync_lands_exactly_the_feeds_datasets(harvest, hub, db, gemini):
    ids = expected_ids()
    assert len(ids) == 47
    stats = first_sync(harvest, hub, db)
    assert live_ids(db) == ids
    assert (stats["created"], stats["failed"]) == (47, 0)
    assert stats["portal_requests"] == len(hub.items_requests()) == math.ceil(47 / PAGE)
    title, url = db.execute("SELECT title, url FROM datasets WHERE source_id = %s",
                            ("23f48820904b46c38f0d4f2d75c69d23_0",)).fetchone()
    assert title == "Substations" and url == f"{hub.url}/datasets/23f48820904b46c38f0d4f2d75c69d23_0"


def test_an_incremental_fetches_only_what_changed(harvest, hub, db, gemini):
    first_sync(harvest, hub, db)
    now_ms = int(time.time() * 1000)
    hub.edit("23f48820904b46c38f0d4f2d75c69d23_0", now_ms, title="Substations (edited)")
    hub.edit("23f48820904b46c38f0d4f2d75c69d23_1", now_ms, tags=["DRPEP", "new tag"])
    hub.requests.clear()
    assert harvest.run().state == "success"
    _, mode, status, stats, _ = last_run(db)
    assert (mode, status) == ("incremental", "committed")
    assert (stats["fetched"], stats["updated"], stats["created"], stats["removed"]) == (2, 2, 0, 0)
    # the filtered listing, and the count (limit=0) that shows nothing else needs reconciling
    assert stats["portal_requests"] == len(hub.items_requests()) == 2
    assert "modified+BETWEEN" in hub.items_requests()[0] and "limit=0" in hub.items_requests()[1]
    assert stats["portal_count"] == 47
    assert db.execute("SELECT title FROM datasets WHERE source_id = %s",
                      ("23f48820904b46c38f0d4f2d75c69d23_0",)).fetchone()[0] == "Substations (edited)"
    assert live_ids(db) == expected_ids()


def test_a_deletion_is_removed_by_the_next_complete_listing(harvest, hub, db, gemini):
    first_sync(harvest, hub, db)
    hub.remove("23f48820904b46c38f0d4f2d75c69d23_0")
    assert harvest.run(full_sync=True).state == "success"
    _, mode, status, stats, _ = last_run(db)
    assert (mode, status, stats["removed"]) == ("full", "committed", 1)
    assert live_ids(db) == expected_ids() - {"23f48820904b46c38f0d4f2d75c69d23_0"}


def test_a_page_loop_is_cut_with_a_warning_and_removes_nothing(harvest, hub, db, gemini, caplog):
    first_sync(harvest, hub, db)
    hub.edit("23f48820904b46c38f0d4f2d75c69d23_0", int(time.time() * 1000), title="Substations (edited)")
    hub.loop_after = PAGE + 1          # page 2's next link goes back to page 1
    caplog.set_level(logging.WARNING, logger="harvester")
    hub.requests.clear()
    assert harvest.run(full_sync=True).state == "success"
    _, mode, status, stats, _ = last_run(db)
    # the full listing was cut after 2 pages: 7 datasets unlisted, none removed, the run incremental
    assert (status, mode, stats["fetched"], stats["updated"], stats["removed"]) == (
        "committed", "incremental", 2 * PAGE, 1, 0)
    assert len(hub.items_requests()) == 3 and "limit=0" in hub.items_requests()[-1]  # + the count
    assert "listing cut" in caplog.text
    assert live_ids(db) == expected_ids()


def test_a_looping_listing_with_a_deletion_fails_reconciliation_and_removes_nothing(harvest, hub, db, gemini):
    first_sync(harvest, hub, db)
    hub.remove("23f48820904b46c38f0d4f2d75c69d23_0")
    hub.loop_after = PAGE + 1
    dag_run = harvest.run(full_sync=True)  # cut listing; the count (46 of 47) calls for reconciling; it loops too
    assert dag_run.state == "failed"
    _, mode, status, _, error = last_run(db)
    assert status == "failed" and "came round again" in error, error
    assert live_ids(db) == expected_ids()


def test_reconciliation_finds_a_deletion_an_incremental_cannot_see(harvest, hub, db, gemini):
    first_sync(harvest, hub, db)
    hub.remove("23f48820904b46c38f0d4f2d75c69d23_0")
    hub.edit("23f48820904b46c38f0d4f2d75c69d23_1", int(time.time() * 1000), title="edited")
    hub.requests.clear()
    assert harvest.run().state == "success"
    _, mode, status, stats, _ = last_run(db)
    assert (mode, status, stats["updated"], stats["removed"]) == ("incremental", "committed", 1, 1)
    paths = hub.items_requests()
    assert "modified+BETWEEN" in paths[0] and "limit=0" in paths[1]          # listing, count: 46 of 47
    assert all("fields=id%2Cmodified" in p for p in paths[2:])                # the id listing, nothing fetched
    assert len(paths) == 2 + math.ceil(46 / PAGE)
    assert live_ids(db) == expected_ids() - {"23f48820904b46c38f0d4f2d75c69d23_0"}


def test_a_server_ignoring_the_modified_filter_is_detected_and_the_run_stays_correct(harvest, hub, db, gemini,
                                                                                    caplog):
    first_sync(harvest, hub, db)
    hub.ignore_filter = True
    hub.edit("23f48820904b46c38f0d4f2d75c69d23_0", int(time.time() * 1000), title="Substations (edited)")
    hub.remove("23f48820904b46c38f0d4f2d75c69d23_1")
    caplog.set_level(logging.WARNING, logger="harvester")
    hub.requests.clear()
    assert harvest.run().state == "success"
    _, mode, status, stats, _ = last_run(db)
    assert (mode, status) == ("full", "committed")        # fell back to a full listing
    assert (stats["updated"], stats["removed"], stats["failed"]) == (1, 1, 0)
    assert "ignored the modified filter" in caplog.text
    assert len(hub.items_requests()) == 1 + math.ceil(46 / PAGE)
    assert live_ids(db) == expected_ids() - {"23f48820904b46c38f0d4f2d75c69d23_1"}


def test_transient_faults_are_retried_and_the_run_succeeds(harvest, hub, db, gemini):
    hub.fail_next(1, status=503)
    hub.fail_next(1, status=429, retry_after="0")
    hub.fail_next(1, truncate=True)
    stats = first_sync(harvest, hub, db, max_retries=3)
    assert live_ids(db) == expected_ids()
    assert stats["portal_requests"] == len(hub.items_requests()) == math.ceil(47 / PAGE) + 3


def test_a_404_fails_at_once_naming_the_portal_and_the_url(harvest, hub, db, gemini):
    harvest.configure(hub.url + "/no-such-site", type="arcgis-hub", page_size=PAGE, max_retries=3)
    dag_run = harvest.run()
    assert dag_run.state == "failed"
    states = {ti.task_id: (str(ti.state), ti.try_number) for ti in dag_run.get_task_instances()}
    assert states["fetch_modified"] == ("failed", 1), states
    _, _, status, _, error = last_run(db)
    assert status == "failed"
    assert "404" in error and "portal test" in error and f"{hub.url}/no-such-site/api/search/v1" in error, error
    assert len(hub.requests) == 1
