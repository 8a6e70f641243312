"""Socrata portals (type: socrata) through real Airflow (dag.test()), real HTTP to the local
Discovery API (harvester.testing.socrata_portal) and a real PostgreSQL. The portal holds the 21
datasets of the real recorded Discovery API answers in tests/data/socrata/ (see its README); the
ids and update times expected are read here from the files themselves."""
from __future__ import annotations

import json
import logging
import math
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from harvester.testing.socrata_portal import SocrataServer

DATA = Path(__file__).resolve().parents[1] / "data" / "socrata"
FILES = ["chicago_transportation.json", "chicago_cta.json", "chicago_ids.json"]
PAGE = 5


def fixture_results() -> dict[str, dict]:
    out: dict[str, dict] = {}
    for name in FILES:
        for result in json.loads((DATA / name).read_text())["results"]:
            out.setdefault(result["resource"]["id"], result)
    return out


def updated_at(result: dict) -> datetime:
    return datetime.strptime(result["resource"]["updatedAt"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc)


@pytest.fixture(autouse=True)
def task_retries(monkeypatch):
    monkeypatch.setenv("HARVESTER_TASK_RETRIES", "2")
    monkeypatch.setenv("HARVESTER_TASK_RETRY_DELAY_SECS", "0")


@pytest.fixture
def portal():
    with SocrataServer(list(fixture_results().values())) as server:
        yield server


def last_run(db):
    return db.execute("SELECT run_id, mode, status, stats, error, since FROM sync_runs ORDER BY run_id DESC LIMIT 1"
                      ).fetchone()


def live_ids(db) -> set[str]:
    return {r[0] for r in db.execute("SELECT source_id FROM datasets WHERE removed_at IS NULL").fetchall()}


def first_sync(harvest, portal, db, **extra):
    harvest.configure(portal.base_url, type="socrata", page_size=PAGE, **extra)
    assert harvest.run().state == "success"
    _, mode, status, stats, _, _ = last_run(db)
    assert (mode, status) == ("full", "committed")
    return stats


def test_first_sync_lands_exactly_the_fixtures_datasets(harvest, portal, db, gemini):
    ids = set(fixture_results())
    assert len(ids) == 21
    stats = first_sync(harvest, portal, db)
    assert live_ids(db) == ids
    assert (stats["created"], stats["failed"]) == (21, 0)
    assert stats["portal_requests"] == len(portal.catalog_requests()) == math.ceil(21 / PAGE)
    title, url, org = db.execute("SELECT title, url, organization FROM datasets WHERE source_id = %s",
                                 ("6iiy-9s97",)).fetchone()
    assert (title, org) == ("CTA - Ridership - Daily Boarding Totals", "Chicago Transit Authority")
    assert url == "https://data.cityofchicago.org/d/6iiy-9s97"


def test_an_incremental_run_fetches_only_what_changed_then_a_full_one_removes_a_deletion(harvest, portal, db, gemini,
                                                                                         caplog):
    first_sync(harvest, portal, db)
    now = datetime.now(timezone.utc)
    stamp = (now + timedelta(minutes=1)).strftime("%Y-%m-%dT%H:%M:%S.000Z")
    portal.edit("zidz-sdfj", stamp, name="Current Employee Names (edited)")
    portal.edit("i6bp-fvbx", stamp, description="A new description.")
    portal.requests.clear()
    caplog.set_level(logging.INFO, logger="harvester.pipeline.steps")
    assert harvest.run().state == "success"
    _, mode, status, stats, _, since = last_run(db)
    assert (mode, status) == ("incremental", "committed")
    # stopping at since is the kind's incremental strategy, not a listing cut short: no warning
    messages = [r.getMessage() for r in caplog.records if r.name == "harvester.pipeline.steps"]
    assert any("stopped at the datasets not modified since" in m for m in messages), messages
    assert not any("was cut short" in m for m in messages), messages
    # what the portal holds updated after the run's since, counted from the files and the edits
    changed = {i for i, r in fixture_results().items() if updated_at(r) > since} | {"zidz-sdfj", "i6bp-fvbx"}
    assert stats["fetched"] == len(changed)
    assert (stats["updated"], stats["created"], stats["removed"]) == (2, 0, 0)
    # newest first, cut at since: only the pages down to the first dataset not updated since, and
    # the reconciliation's count (one result): the portal lists 21, as we hold
    pages = len(changed) // PAGE + 1
    assert stats["portal_requests"] == len(portal.catalog_requests()) == pages + 1
    assert portal.catalog_requests()[-1]["limit"] == ["1"] and stats["portal_count"] == 21
    assert db.execute("SELECT title FROM datasets WHERE source_id = 'zidz-sdfj'").fetchone()[0] == \
        "Current Employee Names (edited)"


def test_a_deletion_is_found_by_the_next_runs_count_and_removed_by_its_complete_listing(harvest, portal, db, gemini):
    first_sync(harvest, portal, db)
    portal.remove("m6dm-c72p")
    portal.requests.clear()
    assert harvest.run().state == "success"
    _, mode, status, stats, _, _ = last_run(db)
    assert (mode, status, stats["removed"], stats["portal_count"]) == ("incremental", "committed", 1, 20)
    assert (stats["reconcile_listed"], stats["reconcile_missing"]) == (20, 0)
    assert live_ids(db) == set(fixture_results()) - {"m6dm-c72p"}
    # the incremental listing (one page: nothing changed), the count, the whole listing
    assert stats["portal_requests"] == len(portal.catalog_requests()) == 1 + 1 + math.ceil(20 / PAGE)


def test_a_full_sync_removes_what_the_portal_no_longer_lists(harvest, portal, db, gemini):
    first_sync(harvest, portal, db)
    portal.remove("m6dm-c72p")
    portal.requests.clear()
    assert harvest.run(full_sync=True).state == "success"
    _, mode, status, stats, _, _ = last_run(db)
    assert (mode, status, stats["removed"], stats["fetched"]) == ("full", "committed", 1, 20)
    assert live_ids(db) == set(fixture_results()) - {"m6dm-c72p"}
    assert len(portal.catalog_requests()) == math.ceil(20 / PAGE)


def test_a_stuck_scroll_on_a_full_sync_is_cut_with_a_warning_and_removes_nothing(harvest, portal, db, gemini,
                                                                                  caplog):
    first_sync(harvest, portal, db)
    portal.ignore_scroll = True  # every scrolled page is the first one again
    caplog.set_level(logging.WARNING, logger="harvester")
    assert harvest.run(full_sync=True).state == "success"
    _, mode, status, stats, _, _ = last_run(db)
    assert (mode, status, stats["removed"]) == ("incremental", "committed", 0)
    assert f"the listing of {harvest.name} was cut short" in caplog.text
    assert live_ids(db) == set(fixture_results())
    # a dataset gone meanwhile: the count asks for a reconciliation, which refuses the stuck
    # listing: the run fails, and still nothing is removed
    portal.remove("m6dm-c72p")
    assert harvest.run(full_sync=True).state == "failed"
    assert last_run(db)[2] == "failed"
    assert live_ids(db) == set(fixture_results())


def test_transient_faults_are_retried_and_the_run_succeeds(harvest, portal, db, gemini):
    portal.fail_next(1, 503, retry_after="0")
    portal.fail_next(1, 429, retry_after="0")
    portal.fail_next(1, truncated=True)
    stats = first_sync(harvest, portal, db, max_retries=3)
    assert live_ids(db) == set(fixture_results())
    assert stats["portal_requests"] == len(portal.catalog_requests()) == math.ceil(21 / PAGE) + 3


def test_a_404_fails_at_once_naming_the_portal_and_the_url(harvest, portal, db, gemini):
    harvest.configure(portal.base_url + "/no-such-portal", type="socrata", page_size=PAGE, max_retries=3)
    dag_run = harvest.run()
    assert dag_run.state == "failed"
    states = {ti.task_id: (str(ti.state), ti.try_number) for ti in dag_run.get_task_instances()}
    assert states["fetch_modified"] == ("failed", 1), states
    _, _, status, _, error, _ = last_run(db)
    assert status == "failed"
    assert "404" in error and "portal test" in error and f"{portal.base_url}/no-such-portal/api/catalog/v1" in error
    assert len(portal.requests) == 1


def test_a_portal_that_ignores_the_order_falls_back_to_a_full_listing(harvest, portal, db, gemini):
    first_sync(harvest, portal, db)
    portal.ignore_order = True
    portal.remove("m6dm-c72p")
    assert harvest.run().state == "success"
    _, mode, status, stats, _, _ = last_run(db)
    assert (mode, status, stats["removed"]) == ("full", "committed", 1)
    assert live_ids(db) == set(fixture_results()) - {"m6dm-c72p"}


def test_an_incremental_run_past_the_api_window_falls_back_to_a_full_scrolled_listing(harvest, portal, db, gemini,
                                                                                      monkeypatch):
    import harvester.sources.socrata as socrata

    # the API's 10,000-result offset window, scaled to the 21 datasets of the fixtures
    monkeypatch.setattr(socrata, "MAX_WINDOW", 10)
    monkeypatch.setattr("harvester.testing.socrata_portal.MAX_WINDOW", 10)
    first_sync(harvest, portal, db)                      # scrolled past the window: all 21
    assert live_ids(db) == set(fixture_results())
    stamp = (datetime.now(timezone.utc) + timedelta(minutes=1)).strftime("%Y-%m-%dT%H:%M:%S.000Z")
    edited = sorted(fixture_results())[:12]               # more changed than the window holds
    for ident in edited:
        portal.edit(ident, stamp, description=f"Edited {ident}.")
    portal.remove(sorted(fixture_results())[-1])
    portal.requests.clear()
    assert harvest.run().state == "success"
    _, mode, status, stats, _, _ = last_run(db)
    assert (mode, status, stats["updated"], stats["removed"]) == ("full", "committed", 12, 1)
    assert live_ids(db) == set(fixture_results()) - {sorted(fixture_results())[-1]}
    queries = portal.catalog_requests()
    # the incremental listing stopped at the window (never asked past it), then the full one scrolled
    offsets = [int(q["offset"][0]) + int(q["limit"][0]) for q in queries if "offset" in q]
    assert offsets == [5, 10]
    assert sum("scroll_id" in q for q in queries) == math.ceil(20 / PAGE)


def test_a_server_capping_its_page_size_is_synced_whole_and_a_full_sync_removes_nothing_live(harvest, portal, db,
                                                                                              gemini):
    # issue 36: at most 3 results a page where 5 are asked; a short page used to end the listing
    portal.max_page_size = 3
    stats = first_sync(harvest, portal, db)
    assert live_ids(db) == set(fixture_results()) and stats["created"] == 21
    assert stats["portal_requests"] == len(portal.catalog_requests()) == 7   # 7 pages of 3: 21, the exact count
    portal.remove("m6dm-c72p")
    assert harvest.run(full_sync=True).state == "success"
    _, mode, status, stats, _, _ = last_run(db)
    assert (mode, status, stats["removed"]) == ("full", "committed", 1)
    assert live_ids(db) == set(fixture_results()) - {"m6dm-c72p"}


# -- past the API's capped count (issue 36) ----------------------------------------------------------
BIG = 12_000


def small(n: int) -> list[dict]:
    """n small results (id, name, type, update time): a domain of thousands in a few MB."""
    start = datetime(2020, 1, 1, tzinfo=timezone.utc)
    return [{"resource": {"id": f"n{i:04d}-{i:05d}", "name": f"Dataset {i}", "type": "dataset",
                          "description": f"Rows of dataset {i}.",
                          "updatedAt": (start + timedelta(seconds=i)).strftime("%Y-%m-%dT%H:%M:%S.000Z")},
             "metadata": {"domain": "data.example.gov"}, "permalink": f"https://data.example.gov/d/n{i:04d}-{i:05d}"}
            for i in range(n)]


@pytest.fixture
def big_portal():
    with SocrataServer(small(BIG)) as server:
        yield server


def big_first_sync(harvest, portal, db):
    harvest.configure(portal.base_url, type="socrata", page_size=1000)
    assert harvest.run().state == "success"
    _, mode, status, stats, _, _ = last_run(db)
    assert (mode, status, stats["created"], stats["fetched"]) == ("full", "committed", BIG, BIG)
    assert live_ids(db) == set(portal.records)   # resultSetSize said 10000: all 12,000 anyway
    # 12 pages of 1,000, then the empty page that proves the end (the capped count cannot)
    assert stats["portal_requests"] == len(portal.catalog_requests()) == BIG // 1000 + 1


def test_twelve_thousand_datasets_past_the_capped_count_sync_whole_and_lose_exactly_the_removed(
        harvest, big_portal, db, gemini, caplog):
    """One first sync of 12,000 (the costly part: once, not once a test), then: nothing changed
    (nothing removed, no reconciliation from the capped count), a reconciliation removing nothing,
    then edits and removals on both sides of the 10,000th: a reconciling incremental, then a full
    sync, each losing exactly the removed."""
    portal = big_portal
    big_first_sync(harvest, portal, db)
    everything = set(portal.records)
    # an incremental run with nothing changed: the count (10000, capped) says "at least 10,000"
    # and we hold 12,000: no drift can be judged from it, nothing is reconciled, nothing removed
    portal.requests.clear()
    caplog.set_level(logging.INFO, logger="harvester.pipeline.steps")
    assert harvest.run().state == "success"
    _, mode, status, stats, _, _ = last_run(db)
    assert (mode, status, stats["removed"], stats["portal_count"]) == ("incremental", "committed", 0, 10_000)
    assert "reconcile_listed" not in stats, "the capped count was taken as exact: 2,000 fewer, a reconciliation"
    assert stats["portal_count_capped"] == 1
    assert "the portal lists at least 10000 datasets (its count is capped at 10000, so not exact)" in caplog.text
    assert live_ids(db) == everything
    # a reconciliation asked for: the whole id listing (12,000, to its empty page) removes nothing
    assert harvest.run(reconcile=True).state == "success"
    _, mode, status, stats, _, _ = last_run(db)
    assert (mode, status, stats["removed"], stats["reconcile_listed"]) == ("incremental", "committed", 0, BIG)
    assert live_ids(db) == everything

    # -- edits and removals on both sides of the 10,000th -------------------------------------------
    ids = sorted(portal.records)
    stamp = (datetime.now(timezone.utc) + timedelta(minutes=1)).strftime("%Y-%m-%dT%H:%M:%S.000Z")
    edited = [ids[5], ids[5_000], ids[11_990]]
    for ident in edited:
        portal.edit(ident, stamp, name=f"Edited {ident}")
    removed = {ids[1], ids[9_999], ids[10_000], ids[11_500], ids[-1]}   # on both sides of the 10,000th
    for ident in removed:
        portal.remove(ident)
    # an incremental run reconciling (asked): the edits fetched, exactly the removed ones removed
    assert harvest.run(reconcile=True).state == "success"
    _, mode, status, stats, _, _ = last_run(db)
    assert (mode, status, stats["updated"], stats["removed"], stats["reconcile_listed"]) == \
        ("incremental", "committed", 3, len(removed), BIG - len(removed))
    assert live_ids(db) == set(ids) - removed
    assert {r[0] for r in db.execute("SELECT source_id FROM datasets WHERE removed_at IS NOT NULL")} == removed
    # more removed on the portal, then a full sync: exactly those go too
    more = {ids[2], ids[10_500]}
    for ident in more:
        portal.remove(ident)
    assert harvest.run(full_sync=True).state == "success"
    _, mode, status, stats, _, _ = last_run(db)
    assert (mode, status, stats["removed"], stats["fetched"]) == ("full", "committed", len(more),
                                                                  BIG - len(removed) - len(more))
    assert live_ids(db) == set(ids) - removed - more
