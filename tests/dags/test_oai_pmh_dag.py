"""OAI-PMH repositories (type: oai-pmh) through real Airflow (dag.test()), real HTTP to the local
repository (testing/oai_pmh_portal.py) and a real PostgreSQL. The repository holds thousands of
records derived from Zenodo's recorded ones, pages of 100 as Zenodo's, tokens that expire and
errors sent with HTTP 422. Few runs, each checking much: the DAG test budget is about a minute."""
from __future__ import annotations

import logging
from datetime import datetime, timedelta, timezone

import pytest

from harvester.testing.oai_pmh_portal import OaiPmhServer, bomb_body, catalogue, derive

START = datetime(2024, 1, 1, tzinfo=timezone.utc)
N = 2000


@pytest.fixture
def repo():
    with OaiPmhServer(catalogue(N, START)) as server:
        yield server


@pytest.fixture(autouse=True)
def task_retries(monkeypatch):
    monkeypatch.setenv("HARVESTER_TASK_RETRIES", "1")
    monkeypatch.setenv("HARVESTER_TASK_RETRY_DELAY_SECS", "0")


def last_run(db):
    return db.execute("SELECT run_id, mode, status, stats, error FROM sync_runs ORDER BY run_id DESC LIMIT 1").fetchone()


def live_ids(db) -> set[str]:
    return {r[0] for r in db.execute("SELECT source_id FROM datasets WHERE removed_at IS NULL").fetchall()}


def ids(numbers) -> set[str]:
    return {f"oai:local:{i}" for i in numbers}


def run(harvest, db, *, full_sync: bool = False, state: str = "success"):
    assert harvest.run(full_sync=full_sync).state == state
    return last_run(db)


def test_first_sync_incremental_deletion_expired_token_and_faults(harvest, repo, db, gemini, caplog):
    harvest.configure(repo.url, type="oai-pmh", max_retries=3)
    # an exact first sync of 2,000 records: 20 pages by exclusive tokens, no Identify needed
    _, mode, status, stats, _ = run(harvest, db)
    assert (mode, status, stats["created"], stats["failed"]) == ("full", "committed", N, 0)
    assert live_ids(db) == ids(range(N))
    assert stats["portal_requests"] == len(repo.requests) == N // 100
    title, url, modified = db.execute("SELECT title, url, metadata_modified FROM datasets WHERE source_id = %s",
                                      ("oai:local:0",)).fetchone()
    assert (title, url) == ("Some Remarkable Oxidation-Products of Benzidine #0",
                            "https://doi.org/10.1080/00359191009519377")
    assert modified == START

    # an incremental: two records edited, one new, one deleted (a deleted header): from= fetches only those
    now = datetime.now(timezone.utc).replace(microsecond=0)
    for n in (5, 1500):
        repo.put(derive(repo.records[n], f"oai:local:{n}", title=f"Edited {n}", datestamp=now))
    repo.put(derive(repo.records[3], "oai:local:new", title="A new record", datestamp=now))
    repo.delete("oai:local:42", now)
    repo.requests.clear()
    _, mode, status, stats, _ = run(harvest, db)
    assert (mode, status) == ("incremental", "committed")
    assert (stats["fetched"], stats["created"], stats["updated"], stats["removed"]) == (3, 1, 2, 1)
    assert [r["verb"] for r in repo.requests] == ["Identify", "ListRecords"] and stats["portal_requests"] == 2
    assert repo.requests[1]["from"] <= now.strftime("%Y-%m-%dT%H:%M:%SZ")
    assert live_ids(db) == ids(range(N)) - ids([42]) | {"oai:local:new"}
    assert db.execute("SELECT c.change_type FROM dataset_changes c JOIN datasets d ON d.id = c.dataset_id "
                      "WHERE d.source_id = 'oai:local:42' ORDER BY c.id DESC LIMIT 1").fetchone()[0] == "removed"

    # 150 changed records (two pages), the token expiring after page 1, two 503s: the faults are retried
    # and the listing restarts from page 1's last datestamp (not from the start, nor from the run's since)
    later = now + timedelta(seconds=1)
    for n in range(1000, 1150):
        repo.put(derive(repo.records[0], f"oai:local:{n}", title=f"Edited again {n}",
                        datestamp=later + timedelta(seconds=n - 1000)))
    repo.requests.clear()
    repo.fail_next(2, 503, retry_after="0")
    repo.token_ttl = 0.0  # every token has expired by the time it comes back
    caplog.set_level(logging.WARNING, logger="harvester")
    _, mode, status, stats, _ = run(harvest, db)
    repo.token_ttl = 120.0
    assert (mode, status, stats["updated"], stats["created"]) == ("incremental", "committed", 150, 0)
    # (the listing from since: the four items of the last run, then the 150: page 1 ends at record 1095)
    restart = (later + timedelta(seconds=95)).strftime("%Y-%m-%dT%H:%M:%SZ")
    asked = [(r["verb"], r.get("from") == restart, "resumptionToken" in r) for r in repo.requests]
    assert asked == [("Identify", False, False)] * 3 + [("ListRecords", False, False), ("ListRecords", False, True),
                                                        ("ListRecords", True, False)], repo.requests
    assert (stats["fetched"], stats["portal_requests"]) == (153, 6)
    assert "badResumptionToken" in caplog.text
    assert db.execute("SELECT count(*) FROM datasets WHERE title LIKE 'Edited again %'").fetchone()[0] == 150


def test_hostile_answers_are_refused_and_nothing_is_lost(harvest, repo, db, gemini, caplog):
    repo.set_records(catalogue(300, START))
    harvest.configure(repo.url, type="oai-pmh", max_retries=1)
    _, mode, status, stats, _ = run(harvest, db)
    assert (mode, status, stats["created"]) == ("full", "committed", 300)

    # a token loop on a full sync with a record gone: the listing is cut, so nothing is removed
    repo.set_records(catalogue(300, START)[1:])
    repo.loop_token = True
    caplog.set_level(logging.WARNING, logger="harvester")
    _, mode, status, stats, _ = run(harvest, db, full_sync=True)
    assert (mode, status, stats["removed"]) == ("incremental", "committed", 0)
    assert "came round again" in caplog.text and len(live_ids(db)) == 300
    repo.loop_token = False

    # an XML bomb: refused unread, the run fails at once (terminal), nothing lost
    repo.canned = (200, bomb_body())
    _, _, status, _, error = run(harvest, db, state="failed")
    assert status == "failed" and "declares a DOCTYPE" in error, error
    assert len(live_ids(db)) == 300
