"""OGC CSW catalogues (type: csw) through real Airflow (dag.test()), real HTTP to the local CSW
server (testing/csw_portal.py) and a real PostgreSQL. The catalogue holds the real records of
tests/data/csw/ (a GeoNetwork INSPIRE answer and pycsw's ISO answers); the ids expected are read
here from the files themselves with a regular expression, not through the source's parser."""
from __future__ import annotations

import logging
import re
from datetime import datetime, timezone
from pathlib import Path

import pytest

from harvester.testing.csw_portal import CswServer, derive, load_records

DATA = Path(__file__).resolve().parents[1] / "data" / "csw"
FILES = ["iso_getrecords_inspire.xml", "iso_getrecords_pycsw.xml", "iso_getrecordbyid_pycsw.xml"]
PAGE = 3


def expected_ids() -> set[str]:
    ids = set()
    for name in FILES:
        text = (DATA / name).read_text()
        ids |= set(re.findall(r"<gmd:fileIdentifier>\s*<gco:CharacterString>([^<]+)</gco:CharacterString>", text))
    return ids


@pytest.fixture
def csw():
    records = [r for name in FILES for r in load_records(DATA / name)]
    with CswServer(records) as server:
        yield server


@pytest.fixture(autouse=True)
def task_retries(monkeypatch):
    monkeypatch.setenv("HARVESTER_TASK_RETRIES", "2")
    monkeypatch.setenv("HARVESTER_TASK_RETRY_DELAY_SECS", "0")


def last_run(db):
    return db.execute("SELECT run_id, mode, status, stats, error FROM sync_runs ORDER BY run_id DESC LIMIT 1").fetchone()


def live_ids(db) -> set[str]:
    return {r[0] for r in db.execute("SELECT source_id FROM datasets WHERE removed_at IS NULL").fetchall()}


def first_sync(harvest, csw, db, **extra) -> dict:
    harvest.configure(csw.url, type="csw", page_size=PAGE, **extra)
    assert harvest.run().state == "success"
    _, mode, status, stats, _ = last_run(db)
    assert (mode, status) == ("full", "committed")
    return stats


def now_stamp() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def test_the_first_sync_lands_exactly_the_fixtures_datasets(harvest, csw, db, gemini):
    assert len(expected_ids()) == 8
    stats = first_sync(harvest, csw, db)
    assert live_ids(db) == expected_ids()
    assert (stats["created"], stats["failed"]) == (8, 0)
    requests = csw.getrecords_requests()
    assert [r["startposition"] for r in requests] == ["1", "4", "7"]
    assert stats["portal_requests"] == 3
    row = db.execute("SELECT title, organization FROM datasets WHERE source_id = %s",
                     ("8dad9c98-0512-4845-a2bf-3ace1c93df6f",)).fetchone()
    assert row == ("SUVIM station network WMS", "National Geographic Institute")


def test_an_incremental_run_fetches_only_what_changed(harvest, csw, db, gemini):
    first_sync(harvest, csw, db)
    records = list(csw.records)
    records[3] = derive(records[3], "366f6257-19eb-4f20-ba78-0698ac4aae77", title="Aerial Photos (edited)",
                        modified=now_stamp())
    records.append(derive(records[2], "new-record-1", title="A new record", modified=now_stamp()))
    csw.set_records(records)
    csw.requests.clear()
    assert harvest.run().state == "success"
    _, mode, status, stats, _ = last_run(db)
    assert (mode, status) == ("incremental", "committed")
    assert (stats["fetched"], stats["created"], stats["updated"], stats["removed"]) == (2, 1, 1, 0)
    requests = csw.getrecords_requests()
    # one filtered page, then the reconcile step's count (one resultType=hits request): 9 = 8 + 1 new
    assert [r["resulttype"] for r in requests] == ["results", "hits"] and len(csw.requests) == 2
    assert stats["portal_requests"] == 2 and stats["portal_count"] == 9
    assert "apiso:Modified" in requests[0]["constraint"]
    assert db.execute("SELECT title FROM datasets WHERE source_id = %s",
                      ("366f6257-19eb-4f20-ba78-0698ac4aae77",)).fetchone()[0] == "Aerial Photos (edited)"
    assert live_ids(db) == expected_ids() | {"new-record-1"}


def test_a_server_ignoring_the_filter_falls_back_to_a_full_listing(harvest, csw, db, gemini, caplog):
    first_sync(harvest, csw, db)
    csw.ignore_filter = True
    csw.set_records([r for r in csw.records if "3e9a8c05" not in load_ids(r)])
    caplog.set_level(logging.WARNING, logger="harvester")
    assert harvest.run().state == "success"
    _, mode, status, stats, _ = last_run(db)
    assert (mode, status, stats["removed"]) == ("full", "committed", 1)
    assert "ignored the modified-since filter" in caplog.text
    assert live_ids(db) == expected_ids() - {"3e9a8c05"}


def test_a_server_refusing_the_filter_falls_back_to_a_full_listing(harvest, csw, db, gemini, caplog):
    first_sync(harvest, csw, db)
    csw.reject_filter = True
    csw.set_records(csw.records + [derive(csw.records[0], "new-record-2", title="New", modified=now_stamp())])
    caplog.set_level(logging.WARNING, logger="harvester")
    csw.requests.clear()
    assert harvest.run().state == "success"
    _, mode, status, stats, _ = last_run(db)
    assert (mode, status, stats["created"], stats["unchanged"]) == ("full", "committed", 1, 8)
    assert "InvalidParameterValue" in caplog.text and "falling back to a full sync" in caplog.text
    assert [bool(r.get("constraint")) for r in csw.getrecords_requests()] == [True, False, False, False]


def load_ids(record) -> str:
    from harvester.testing.csw_portal import record_id

    return record_id(record)


def test_a_deletion_is_removed_by_the_next_complete_listing(harvest, csw, db, gemini):
    first_sync(harvest, csw, db)
    gone = "eeae2de7-0a09-4b69-b7a0-0b6b20903fd5"
    csw.set_records([r for r in csw.records if load_ids(r) != gone])
    assert harvest.run(full_sync=True).state == "success"
    _, mode, status, stats, _ = last_run(db)
    assert (mode, status, stats["removed"], stats["unchanged"]) == ("full", "committed", 1, 7)
    assert live_ids(db) == expected_ids() - {gone}


def test_an_incremental_run_finds_a_deletion_by_the_count_and_reconciles(harvest, csw, db, gemini):
    first_sync(harvest, csw, db)
    gone = "eeae2de7-0a09-4b69-b7a0-0b6b20903fd5"
    csw.set_records([r for r in csw.records if load_ids(r) != gone])
    csw.requests.clear()
    assert harvest.run().state == "success"
    _, mode, status, stats, _ = last_run(db)
    assert (mode, status, stats["removed"], stats["fetched"]) == ("incremental", "committed", 1, 0)
    assert (stats["portal_count"], stats["reconcile_listed"], stats["reconcile_fetched"]) == (7, 7, 0)
    # the filtered listing, the count, then the summaries of every record (page size 3): nothing refetched
    kinds = [(r["request"], r["resulttype"], r["elementsetname"]) for r in csw.requests]
    assert kinds == [("GetRecords", "results", "full"), ("GetRecords", "hits", "brief")] + \
        [("GetRecords", "results", "summary")] * 3
    assert live_ids(db) == expected_ids() - {gone}


def test_reconciliation_fetches_by_id_what_the_filter_missed(harvest, csw, db, gemini):
    first_sync(harvest, csw, db)
    # a record added with an old dateStamp: the modified filter cannot see it, the count can
    late = derive(csw.records[2], "late-record", title="Late record", modified="2001-01-01T00:00:00Z")
    csw.set_records(csw.records + [late])
    csw.requests.clear()
    assert harvest.run().state == "success"
    _, mode, status, stats, _ = last_run(db)
    assert (mode, status, stats["created"]) == ("incremental", "committed", 1)
    assert (stats["reconcile_missing"], stats["reconcile_fetched"]) == (1, 1)
    by_id = [r for r in csw.requests if r["request"] == "GetRecordById"]
    assert [r["id"] for r in by_id] == ["late-record"]
    assert live_ids(db) == expected_ids() | {"late-record"}


def test_a_page_loop_is_cut_and_removes_nothing(harvest, csw, db, gemini, caplog):
    first_sync(harvest, csw, db)
    csw.set_records([r for r in csw.records if load_ids(r) != "3e9a8c05"])
    csw.stuck_next = 1
    caplog.set_level(logging.WARNING, logger="harvester")
    # the cut full listing removes nothing and the run goes on as incremental; the count (one
    # fewer) then asks for a reconciliation, whose identifier listing is cut the same way and is
    # refused (issue 36: it used to be taken as the portal's whole list, only the removal guard
    # keeping the rest): the run fails, and still nothing is removed
    assert harvest.run(full_sync=True).state == "failed"
    _, mode, status, stats, error = last_run(db)
    assert status == "failed" and "the identifier listing was cut short" in error
    assert "does not advance" in caplog.text
    assert "3e9a8c05" in live_ids(db) and len(live_ids(db)) == len(expected_ids())


def test_transient_faults_are_retried(harvest, csw, db, gemini):
    csw.fail_next(1, 503)
    csw.fail_next(1, 429, retry_after="0")
    csw.fail_next(1, truncated=True)
    stats = first_sync(harvest, csw, db, max_retries=3)
    assert live_ids(db) == expected_ids()
    assert stats["portal_requests"] == len(csw.getrecords_requests()) == 3 + 3


def test_a_404_fails_at_once_naming_the_portal_and_the_url(harvest, csw, db, gemini):
    harvest.configure(csw.base_url + "/no-such-csw", type="csw", page_size=PAGE, max_retries=3)
    dag_run = harvest.run()
    assert dag_run.state == "failed"
    states = {ti.task_id: (str(ti.state), ti.try_number) for ti in dag_run.get_task_instances()}
    assert states["fetch_modified"] == ("failed", 1), states
    _, _, status, _, error = last_run(db)
    assert status == "failed"
    assert "404" in error and "portal test" in error and f"{csw.base_url}/no-such-csw" in error, error
    assert len(csw.requests) == 1
