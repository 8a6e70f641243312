"""udata portals (type: udata) through real Airflow (dag.test()), real HTTP to the local udata
server and a real PostgreSQL. The catalogue is built from udata's real recorded datasets
(../shared/portal-samples/udata: 18 of Angers Loire Métropole, a harvested GTFS dataset, INSEE's
deaths file) copied to 1,500 with new ids and dates in 2024 (testing/udata_portal.py ``catalogue``)."""
from __future__ import annotations

import math
from datetime import datetime, timezone

import pytest

from harvester.testing.udata_portal import UdataPortal, catalogue, organizations_of

N = 1500
PAGE = 100


@pytest.fixture(autouse=True)
def task_retries(monkeypatch):
    monkeypatch.setenv("HARVESTER_TASK_RETRIES", "1")
    monkeypatch.setenv("HARVESTER_TASK_RETRY_DELAY_SECS", "0")


def last_run(db):
    return db.execute("SELECT run_id, mode, status, stats, error FROM sync_runs ORDER BY run_id DESC LIMIT 1").fetchone()


def live_ids(db) -> set[str]:
    return {r[0] for r in db.execute("SELECT source_id FROM datasets WHERE removed_at IS NULL").fetchall()}


def test_first_sync_incremental_reconciliation_and_a_fault(harvest, db, gemini):
    datasets = catalogue(N)
    ids = [d["id"] for d in datasets]
    with UdataPortal(datasets, organizations_of(datasets)) as portal:
        harvest.configure(portal.url, type="udata", page_size=PAGE, language="french", max_retries=3)

        # 1. the first sync lands exactly the catalogue, listed in creation order to its end
        assert harvest.run().state == "success"
        _, mode, status, stats, _ = last_run(db)
        assert (mode, status, stats["created"], stats["failed"]) == ("full", "committed", N, 0)
        assert live_ids(db) == set(ids)
        assert stats["portal_requests"] == len(portal.requests) == math.ceil(N / PAGE)
        title, url = db.execute("SELECT title, url FROM datasets WHERE source_id = %s", (ids[19],)).fetchone()
        assert title == "Fichier des personnes décédées #19"
        assert url == "https://www.data.gouv.fr/fr/datasets/fichier-des-personnes-decedees-19/"

        # 2. an incremental fetches only the two datasets whose files changed: one page, then the count
        now = datetime.now(timezone.utc)
        portal.edit(ids[7], now, data=True, title="Nomenclature des déchets (2025)")
        portal.edit(ids[1234], now, data=True, tags=["dechets", "nouveau"])
        portal.requests.clear()
        assert harvest.run().state == "success"
        _, mode, status, stats, _ = last_run(db)
        assert (mode, status) == ("incremental", "committed")
        assert (stats["fetched"], stats["updated"], stats["created"], stats["removed"]) == (2, 2, 0, 0)
        assert stats["portal_requests"] == len(portal.requests) == 2 and stats["portal_count"] == N
        assert "sort=-last_update" in portal.requests[0] and "page_size=1" in portal.requests[1]
        assert db.execute("SELECT title FROM datasets WHERE source_id = %s", (ids[7],)).fetchone()[0] == \
            "Nomenclature des déchets (2025)"

        # 3. a deletion and an edit of the metadata alone (last_update unchanged, so not in the
        # incremental's pages): the count (N - 1) calls for a reconciliation, which finds both; a
        # 503 and a body cut short on the way are retried
        portal.delete(ids[3])
        portal.edit(ids[42], datetime.now(timezone.utc), title="Edited metadata only")
        portal.fail_next(1, status=503)
        portal.fail_next(1, truncate=True)
        portal.requests.clear()
        assert harvest.run().state == "success"
        _, mode, status, stats, _ = last_run(db)
        assert (mode, status, stats["updated"], stats["removed"]) == ("incremental", "committed", 1, 1)
        id_pages = [p for p in portal.list_requests() if "sort=created" in p]
        assert len(id_pages) == math.ceil((N - 1) / PAGE)
        assert stats["portal_requests"] == len(portal.requests) == 1 + 1 + len(id_pages) + 1 + 2  # + the retries
        assert live_ids(db) == set(ids) - {ids[3]}
        assert db.execute("SELECT title FROM datasets WHERE source_id = %s", (ids[42],)).fetchone()[0] == \
            "Edited metadata only"


def test_hostile_answers_are_refused_and_nothing_is_lost(harvest, db, gemini, monkeypatch):
    datasets = catalogue(300)
    ids = {d["id"] for d in datasets}
    with UdataPortal(datasets, organizations_of(datasets)) as portal:
        harvest.configure(portal.url, type="udata", page_size=PAGE, max_retries=1)
        assert harvest.run().state == "success"
        assert live_ids(db) == ids

        # a next_page looping back to page 1, and a deletion: the full listing is cut, nothing removed
        portal.loop_after = 2
        portal.delete(datasets[0]["id"])
        portal.requests.clear()
        dag_run = harvest.run(full_sync=True)
        _, mode, status, stats, error = last_run(db)
        # the cut listing made the run incremental; the count (299 of 300) asked for a reconciliation,
        # whose id listing loops too: refused, the run fails and nothing is removed
        assert dag_run.state == "failed" and status == "failed", error
        assert "could not be read whole" in error
        assert live_ids(db) == ids

        # a page whose body never ends stops at the size cap; the run fails, nothing lost
        portal.loop_after = None
        portal.endless_page = 2
        monkeypatch.setenv("HARVESTER_FETCH_MAX_BYTES", "1MB")
        dag_run = harvest.run(full_sync=True)
        _, _, status, _, error = last_run(db)
        assert dag_run.state == "failed" and status == "failed" and "larger than 1MB" in error, error
        assert live_ids(db) == ids
