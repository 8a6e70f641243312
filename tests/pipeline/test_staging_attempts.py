"""One attempt at a time stages a run (sql/024): a task process that outlived its Airflow supervisor
(a worker killed with SIGKILL on a host that leaves the task's own process group running) goes on
listing while Airflow retries the task; the retry takes the run's staging over, and the older
attempt stops at its next page instead of writing into what the retry staged. Real PostgreSQL, the
local CKAN portal over HTTP; the two attempts are two connections, as two processes would be."""
from __future__ import annotations

import threading
import time

import pytest

from harvester.config.portals import Portal
from harvester.pipeline import steps as pipeline
from harvester.store import db as store_db
from harvester.store import runs
from harvester.testing.samples import distinct_records

PAGE = 10


def staged(conn, run_id: int) -> list[tuple[int, str]]:
    return conn.execute("SELECT seq, source_id FROM staging_records WHERE run_id = %s ORDER BY seq",
                        (run_id,)).fetchall()


def wait_for(condition, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"waited {timeout:g}s for {what}")
        time.sleep(0.05)


def test_a_retried_listing_stops_the_attempt_still_running(database_url, db, portal_server, samples):
    records = distinct_records(samples, 6 * PAGE)
    portal_server.set_records(records)
    portal = Portal(name="p", url=portal_server.base_url, politeness_delay=0, page_size=PAGE)
    run_id = pipeline.begin(db, portal, full_sync=True)["run_id"]
    portal_server.response_delay = 0.5  # the first attempt lists slowly
    first: dict = {}

    def first_attempt():
        with store_db.prepare(store_db.connect_url(database_url)) as conn:
            try:
                first["result"] = pipeline.fetch_modified(conn, portal, run_id, pipeline.source_for(portal))
            except BaseException as exc:  # noqa: BLE001 - the test reads it
                first["error"] = exc

    thread = threading.Thread(target=first_attempt, name="first-attempt")
    thread.start()
    try:
        wait_for(lambda: len(staged(db, run_id)) >= PAGE, "the first attempt's first page")
        portal_server.response_delay = 0.0
        retried = pipeline.fetch_modified(db, portal, run_id, pipeline.source_for(portal))  # the retry
    finally:
        thread.join(timeout=120)
    assert not thread.is_alive()
    assert isinstance(first.get("error"), runs.AttemptSuperseded), first
    assert "a later attempt of this task took over its staging" in str(first["error"])
    assert retried["fetched"] == len(records)
    # what the run staged is the retry's listing, once: every record, seq 0 to n-1
    rows = staged(db, run_id)
    assert [seq for seq, _ in rows] == list(range(len(records)))
    assert sorted(source_id for _, source_id in rows) == sorted(r["id"] for r in records)


def test_an_attempt_whose_run_was_taken_over_writes_nothing(db):
    portal = Portal(name="p", url="https://p.example.org")
    run_id = pipeline.begin(db, portal, full_sync=True)["run_id"]
    older = runs.claim_staging(db, run_id)
    newer = runs.claim_staging(db, run_id)
    assert older != newer
    with runs.staging_page(db, run_id, newer):
        pass
    with pytest.raises(runs.AttemptSuperseded) as stopped:
        with runs.staging_page(db, run_id, older):
            db.execute("INSERT INTO staging_listing (run_id, source_id) VALUES (%s, 'x')", (run_id,))
    assert not stopped.value.transient
    assert db.execute("SELECT count(*) FROM staging_listing WHERE run_id = %s", (run_id,)).fetchone()[0] == 0
