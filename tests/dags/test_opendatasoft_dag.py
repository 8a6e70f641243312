"""OpenDataSoft portals through real Airflow (dag.test()), real HTTP to a local Explore v2.1
catalogue (harvester.testing.opendatasoft_portal) and a real PostgreSQL: the real fixtures of
tests/data/opendatasoft land whole (ids read from the files themselves), an incremental run asks
only for what changed, a dataset the portal dropped is removed by the next run's reconciliation
(count, then a narrowed id listing) and by a full listing, a portal ignoring the modified filter
falls back to a full listing, a page loop on a full sync is cut and removes
nothing, a 503 is retried and a 404 fails at once; and 12,000 datasets, past the records endpoint's
10,000 window: a first sync stores them all (the rest from the exports endpoint), an incremental
run after edits, and a removal reconciled from an exported identifier listing removes exactly what
the portal dropped."""
from __future__ import annotations

import copy
import json
import logging
from datetime import datetime, timezone
from pathlib import Path

import pytest

from harvester.testing.opendatasoft_portal import OpenDataSoftPortal, fixture_datasets

DATA = Path(__file__).resolve().parents[1] / "data" / "opendatasoft"


def fixture_ids() -> set[str]:
    """The fixtures' dataset ids, from the files alone (v2.0 ``dataset.dataset_id``, v1.0 ``datasetid``)."""
    rte = json.loads((DATA / "rte-catalog-v2.0.json").read_text(encoding="utf-8"))
    udata = json.loads((DATA / "udata-ods-search-v1.0.json").read_text(encoding="utf-8"))
    return {d["dataset"]["dataset_id"] for d in rte["datasets"]} | {d["datasetid"] for d in udata["datasets"]}


@pytest.fixture
def ods():
    with OpenDataSoftPortal(fixture_datasets()) as server:
        yield server


def last_run(db):
    return db.execute("SELECT run_id, mode, status, stats FROM sync_runs ORDER BY run_id DESC LIMIT 1").fetchone()


def live(db) -> dict[str, str]:
    return dict(db.execute("SELECT source_id, title FROM datasets WHERE removed_at IS NULL").fetchall())


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat()


def test_first_sync_incremental_and_removal(harvest, ods, db, gemini):
    harvest.configure(ods.base_url, type="opendatasoft", max_removal_share=0.5)  # 1 of 4 is over the default
    assert harvest.run().state == "success"
    run_id, mode, status, stats = last_run(db)
    assert (mode, status) == ("full", "committed")
    assert set(live(db)) == fixture_ids() and len(fixture_ids()) == 5
    assert (stats["created"], stats["failed"], stats["portal_requests"]) == (5, 0, len(ods.requests)) == (5, 0, 1)
    url = db.execute("SELECT url FROM datasets WHERE source_id = 'test-a'").fetchone()[0]
    assert url == f"{ods.base_url}/explore/dataset/test-a/"

    # an edit on the portal: the next run asks for what changed since its watermark, and gets it alone
    ods.edit("test-b", now_iso(), title="test-b, renamed")
    ods.requests.clear()
    assert harvest.run().state == "success"
    run_id, mode, status, stats = last_run(db)
    assert (mode, status) == ("incremental", "committed")
    asked, counted = ods.catalog_requests()                  # the changes, then the count (reconcile)
    assert asked["where"].startswith("(default.modified >= date'") and counted["limit"] == "0"
    assert stats["portal_requests"] == 2 and stats["portal_count"] == 5
    assert (stats["fetched"], stats["updated"], stats["created"], stats["removed"]) == (1, 1, 0, 0)
    assert live(db)["test-b"] == "test-b, renamed"

    # a dataset dropped by the portal: the incremental run's count (limit=0) no longer matches what we
    # hold, so it reconciles: the ids listed narrowed (select), and what is no longer listed is removed
    ods.remove("test-c")
    ods.requests.clear()
    assert harvest.run().state == "success"
    run_id, mode, status, stats = last_run(db)
    assert (mode, status, stats["removed"], stats["portal_count"]) == ("incremental", "committed", 1, 4)
    assert [(q["limit"], "where" in q, q.get("select")) for q in ods.catalog_requests()] == [
        ("100", True, None), ("0", False, None), ("100", False, "dataset_id,modified")]
    assert stats["portal_requests"] == 3 and stats["reconcile_listed"] == 4
    assert set(live(db)) == fixture_ids() - {"test-c"}

    # and a complete listing (a full sync) removes what the portal dropped as well
    ods.remove("test-d")
    assert harvest.run(full_sync=True).state == "success"
    run_id, mode, status, stats = last_run(db)
    assert (mode, status, stats["removed"]) == ("full", "committed", 1)
    assert set(live(db)) == fixture_ids() - {"test-c", "test-d"}


def test_a_portal_ignoring_the_filter_falls_back_to_a_full_listing(harvest, ods, db, gemini):
    harvest.configure(ods.base_url, type="opendatasoft")
    assert harvest.run().state == "success"
    ods.ignore_filter = True
    ods.remove("test-d")
    ods.requests.clear()
    assert harvest.run().state == "success"
    run_id, mode, status, stats = last_run(db)
    assert (mode, status, stats["removed"]) == ("full", "committed", 1)
    assert [q.get("where", "") for q in ods.catalog_requests()][1:] == [""]   # filtered, then the full listing
    assert set(live(db)) == fixture_ids() - {"test-d"}


def test_a_page_loop_on_a_full_sync_is_cut_with_a_warning_and_removes_nothing(harvest, ods, db, gemini, caplog):
    harvest.configure(ods.base_url, type="opendatasoft", page_size=2)
    assert harvest.run().state == "success"
    assert set(live(db)) == fixture_ids()
    ods.loop = True   # every page is the first: the listing stops at the second, 2 of 5 datasets listed
    ods.requests.clear()
    caplog.set_level(logging.WARNING, logger="harvester")
    assert harvest.run(full_sync=True).state == "success"
    run_id, mode, status, stats = last_run(db)
    assert (mode, status, stats["fetched"], stats["removed"]) == ("incremental", "committed", 2, 0)
    assert "repeats datasets already listed" in caplog.text
    assert f"the listing of {harvest.name} was cut short" in caplog.text
    assert set(live(db)) == fixture_ids()


def test_503_is_retried(harvest, ods, db, gemini):
    harvest.configure(ods.base_url, type="opendatasoft", max_retries=3)
    ods.fail_next(2, 503)
    assert harvest.run().state == "success"
    run_id, mode, status, stats = last_run(db)
    assert status == "committed" and stats["portal_requests"] == 3
    assert set(live(db)) == fixture_ids()


def test_a_429_with_retry_after_and_a_truncated_body_are_retried(harvest, ods, db, gemini):
    harvest.configure(ods.base_url, type="opendatasoft", max_retries=3)
    ods.fail_next(1, 429, retry_after="0")
    assert harvest.run().state == "success"
    assert last_run(db)[2] == "committed" and set(live(db)) == fixture_ids()
    ods.truncate_next(1)
    assert harvest.run(full_sync=True).state == "success"
    run_id, mode, status, stats = last_run(db)
    assert (mode, status) == ("full", "committed") and stats["portal_requests"] == 2
    assert set(live(db)) == fixture_ids()


def test_404_fails_at_once(harvest, ods, db, gemini):
    harvest.configure(ods.base_url + "/wrong", type="opendatasoft", max_retries=3)
    dag_run = harvest.run()
    assert dag_run.state == "failed"
    states = {ti.task_id: str(ti.state) for ti in dag_run.get_task_instances()}
    assert states["fetch_modified"] == "failed", states
    status, error = db.execute("SELECT status, error FROM sync_runs ORDER BY run_id DESC LIMIT 1").fetchone()
    assert status == "failed" and "404" in error and f"{ods.base_url}/wrong/api/explore/v2.1/catalog/datasets" in error
    assert len(ods.requests) == 1


def numbered(n: int) -> list[dict]:
    """``n`` datasets copied from the real fixtures (ods-00000...), modified in 2024."""
    bases = fixture_datasets()
    out = []
    for i in range(n):
        ds = copy.deepcopy(bases[i % len(bases)])
        ds["dataset_id"] = f"ods-{i:05d}"
        ds["metas"]["default"].update(title=f"Dataset {i}", modified="2024-01-01T00:00:00+00:00")
        out.append(ds)
    return out


def test_12000_datasets_first_sync_incremental_and_removal(harvest, db, gemini):
    # past the records endpoint's 10,000 window: the first page, then the rest from the exports
    # endpoint, whose requests the local portal answers only within the documented limits
    with OpenDataSoftPortal(numbered(12_000)) as ods:
        harvest.configure(ods.base_url, type="opendatasoft")
        assert harvest.run().state == "success"
        run_id, mode, status, stats = last_run(db)
        assert (mode, status, stats["created"], stats["failed"]) == ("full", "committed", 12_000, 0)
        assert len(live(db)) == 12_000 and set(live(db)) == {f"ods-{i:05d}" for i in range(12_000)}
        assert stats["portal_requests"] == 2 and len(ods.export_requests()) == 1
        assert all(int(q["offset"]) + int(q["limit"]) <= 10_000 for q in ods.catalog_requests())

        # edits: the incremental run asks for what changed (one page: 3 datasets) and the count agrees
        for i in (5, 10_500, 11_999):
            ods.edit(f"ods-{i:05d}", now_iso(), title=f"Dataset {i}, edited")
        ods.requests.clear()
        assert harvest.run().state == "success"
        run_id, mode, status, stats = last_run(db)
        assert (mode, status, stats["fetched"], stats["updated"], stats["removed"]) == (
            "incremental", "committed", 3, 3, 0)
        assert stats["portal_count"] == 12_000 and ods.export_requests() == []
        assert live(db)["ods-10500"] == "Dataset 10500, edited"

        # removals: the count (11,997) disagrees, so it reconciles: the ids listed from the export
        # (select=dataset_id,modified), and exactly what the portal dropped is removed
        gone = {"ods-00000", "ods-10001", "ods-11998"}
        for ident in gone:
            ods.remove(ident)
        ods.requests.clear()
        assert harvest.run().state == "success"
        run_id, mode, status, stats = last_run(db)
        assert (mode, status, stats["removed"], stats["portal_count"]) == ("incremental", "committed", 3, 11_997)
        assert stats["reconcile_listed"] == 11_997
        [export] = ods.export_requests()
        assert export["select"] == "dataset_id,modified"
        assert set(live(db)) == {f"ods-{i:05d}" for i in range(12_000)} - gone
        removed = {r[0] for r in db.execute("SELECT source_id FROM datasets WHERE removed_at IS NOT NULL")}
        assert removed == gone
