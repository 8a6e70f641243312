"""SDMX REST services (type: sdmx) through real Airflow (dag.test()), real HTTP to the local SDMX
service (testing/sdmx_portal.py) and a real PostgreSQL. The service holds INSEE's 663 real
dataflows (../shared/portal-samples/sdmx/, names in French and English); the ids expected are read
here from the file with a regular expression, not through the source's parser. One test walks a
portal's life, each run checking much (dag.test() runs are what costs): an exact first sync, a
no-change run of one 304, a version bump, a removal and a fault retried in one run, a hostile
answer refused with nothing lost, and a service answering "no results" removing nothing."""
from __future__ import annotations

import logging
import re

import pytest

from harvester.testing.hostile_documents import nested_entities_rdfxml
from harvester.testing.samples import portal_sample
from harvester.testing.sdmx_portal import INSEE, SdmxServer, derive, insee_dataflows, key


def expected_ids() -> set[str]:
    text = portal_sample("sdmx", INSEE).read_text(encoding="utf-8")
    return {f"{a}:{i}" for i, a in re.findall(r'<str:Dataflow id="([^"]+)" urn="[^"]+" agencyID="([^"]+)"', text)}


@pytest.fixture
def sdmx():
    with SdmxServer(insee_dataflows()) as server:
        yield server


@pytest.fixture(autouse=True)
def task_retries(monkeypatch):
    monkeypatch.setenv("HARVESTER_TASK_RETRIES", "2")
    monkeypatch.setenv("HARVESTER_TASK_RETRY_DELAY_SECS", "0")


def last_run(db):
    return db.execute("SELECT run_id, mode, status, stats, error FROM sync_runs ORDER BY run_id DESC LIMIT 1").fetchone()


def live_ids(db) -> set[str]:
    return {r[0] for r in db.execute("SELECT source_id FROM datasets WHERE removed_at IS NULL").fetchall()}


def test_an_sdmx_portals_life_first_sync_304_version_bump_removal_fault_and_hostile_answers(
        harvest, sdmx, db, gemini, caplog):
    from harvester.store.search import search

    ids = expected_ids()
    assert len(ids) == 663
    harvest.configure(sdmx.url, type="sdmx", page_size=200, language="french", max_retries=2)

    # 1. the first sync: exactly INSEE's 663 dataflows, from one request, French titles shown
    assert harvest.run().state == "success"
    _, mode, status, stats, _ = last_run(db)
    assert (mode, status) == ("full", "committed")
    assert (stats["created"], stats["failed"], stats["portal_requests"]) == (663, 0, 1)
    assert live_ids(db) == ids
    title, language, raw = db.execute("SELECT title, language::text, raw FROM datasets WHERE source_id = %s",
                                      ("FR1:ACT-TRIM-ANC",)).fetchone()
    assert (title, language) == ("Activité par sexe et âge - Séries trimestrielles", "french")
    assert raw["translations"]["title"] == {"fr": "Activité par sexe et âge - Séries trimestrielles",
                                            "en": "Activity by sex and age - Quarterly series"}
    # the search text holds both languages: found by its English name as by its French one
    for query in ("Activity by sex and age quarterly series", "activité par sexe et âge trimestrielles"):
        found = search(db, query, mode="text", limit=5)
        assert "Activité par sexe et âge - Séries trimestrielles" in [i["title"] for i in found.items], query

    # 2. nothing changed: one conditional request answered 304, nothing processed
    sdmx.requests.clear()
    assert harvest.run().state == "success"
    _, mode, status, stats, _ = last_run(db)
    assert (mode, status, stats["portal_requests"], stats.get("fetched", 0)) == ("incremental", "committed", 1, 0)
    (path, _, headers), = sdmx.requests
    assert path == "/rest/dataflow/all/all/latest" and "if-none-match" in headers and "if-modified-since" in headers

    # 3. a version bump and a dataflow gone, with a 503 on the way: the complete message finds both
    flows = insee_dataflows()
    bumped, gone = key(flows[10]), key(flows[20])
    flows[10] = derive(flows[10], version="2.0")
    sdmx.set_dataflows([f for f in flows if key(f) != gone])
    sdmx.fail_next(1, 503)
    sdmx.requests.clear()
    assert harvest.run().state == "success"
    _, mode, status, stats, _ = last_run(db)
    assert (mode, status) == ("full", "committed")
    assert (stats["updated"], stats["removed"], stats["unchanged"], stats["portal_requests"]) == (1, 1, 661, 2)
    assert live_ids(db) == ids - {gone}
    url, version = db.execute("SELECT url, raw->>'version' FROM datasets WHERE source_id = %s", (bumped,)).fetchone()
    assert version == "2.0" and url.endswith(f"/dataflow/{bumped.replace(':', '/')}/2.0")

    # 4. a hostile answer (nested entities) fails the run at once; nothing is lost
    sdmx.canned = (200, nested_entities_rdfxml(), "application/xml")
    sdmx.requests.clear()
    dag_run = harvest.run()
    assert dag_run.state == "failed"
    _, _, status, _, error = last_run(db)
    assert status == "failed" and "declares a DOCTYPE" in error, error
    assert len(sdmx.requests) == 1  # terminal: neither the fetcher nor Airflow tried again
    assert live_ids(db) == ids - {gone}

    # 5. a service answering "no results" (404, SDMX error 100) removes nothing
    sdmx.canned = None
    sdmx.set_dataflows([])
    caplog.set_level(logging.WARNING, logger="harvester")
    assert harvest.run().state == "success"
    _, mode, status, stats, _ = last_run(db)
    assert (mode, status, stats.get("removed", 0)) == ("incremental", "committed", 0)
    assert "the service lists no dataflows" in caplog.text
    assert live_ids(db) == ids - {gone}
