"""DCAT over SPARQL (type: dcat-sparql) through real Airflow (dag.test()), real HTTP to the local
SPARQL endpoint (rdflib's engine, Virtuoso's limits) and a real PostgreSQL. The catalogue: the 12
real datasets of dati.unibo.it's DCAT-AP export (Italian and English) and 288 derived from them."""
from __future__ import annotations

import pytest

from harvester.testing.sparql_portal import (UNIBO, SparqlServer, dataset_iris, derived_catalogue, sample_catalogue,
                                             sample_graph)

PAGE = 100
N = 288  # + the 12 real ones: 300


@pytest.fixture
def endpoint():
    graph = derived_catalogue(sample_graph(UNIBO), N)
    graph += sample_graph(UNIBO)
    with SparqlServer(graph, result_cap=10_000) as server:
        yield server


@pytest.fixture(autouse=True)
def task_retries(monkeypatch):
    monkeypatch.setenv("HARVESTER_TASK_RETRIES", "2")
    monkeypatch.setenv("HARVESTER_TASK_RETRY_DELAY_SECS", "0")


def last_run(db):
    return db.execute("SELECT run_id, mode, status, stats, error FROM sync_runs ORDER BY run_id DESC LIMIT 1").fetchone()


def live_ids(db) -> set[str]:
    return {r[0] for r in db.execute("SELECT source_id FROM datasets WHERE removed_at IS NULL").fetchall()}


def expected_ids() -> set[str]:
    return {f"https://data.example.org/dataset/{i:06d}" for i in range(N)} | set(dataset_iris(sample_graph(UNIBO)))


def test_first_sync_incremental_removal_and_a_fault_retried(harvest, endpoint, db, gemini):
    harvest.configure(endpoint.url, type="dcat-sparql", page_size=PAGE, language="it", max_retries=3)
    endpoint.fail_next(1, status=503)  # the first listing page: retried by the fetcher
    assert harvest.run().state == "success"
    _, mode, status, stats, _ = last_run(db)
    assert (mode, status) == ("full", "committed")
    assert live_ids(db) == expected_ids()
    assert (stats["created"], stats["failed"]) == (N + 12, 0)
    kinds = endpoint.kinds_of_queries()
    assert kinds.count("listing") == 1 + 4  # the one answered 503, then 100, 100, 100 and the empty page (the proof)
    assert stats["portal_requests"] == len(endpoint.requests) == len(kinds)
    title, language, raw = db.execute("SELECT title, language, raw FROM datasets WHERE source_id = %s",
                                      ("https://dati.unibo.it/dataset/0824deeb-8e76-4281-9120-c2177d0b13ca",)).fetchone()
    assert title == "Bilancio di esercizio 2016" and str(language) == "italian"
    assert raw["translations"]["title"]["en"] == "Financial Statements 2016"

    # an incremental: two edits, and a removal only reconciliation can see
    endpoint.edit("https://data.example.org/dataset/000007", modified="2030-01-01T00:00:00Z", title="Modificato",
                  lang="it")
    endpoint.edit("https://data.example.org/dataset/000287", modified="2030-01-02T00:00:00Z", title="Edited",
                  lang="en")
    endpoint.remove("https://data.example.org/dataset/000150")
    endpoint.queries.clear()
    endpoint.requests.clear()
    assert harvest.run().state == "success"
    _, mode, status, stats, _ = last_run(db)
    assert (mode, status) == ("incremental", "committed")
    assert (stats["fetched"], stats["updated"], stats["removed"]) == (2, 2, 1)
    kinds = endpoint.kinds_of_queries()
    # the filtered listing (2 rows, then the empty page), their details, the count (299 of 300),
    # then the id listing that finds the removal; nothing fetched again
    assert kinds[:4] == ["incremental", "details", "incremental", "count"], kinds
    assert kinds[4:] == ["listing"] * 4, kinds
    assert stats["portal_requests"] == len(endpoint.requests) == 8
    assert db.execute("SELECT title FROM datasets WHERE source_id = %s",
                      ("https://data.example.org/dataset/000007",)).fetchone()[0] == "Modificato"
    assert live_ids(db) == expected_ids() - {"https://data.example.org/dataset/000150"}


def test_an_endpoint_ignoring_the_keyset_filter_removes_nothing_and_fails_reconciliation(harvest, db, gemini,
                                                                                         caplog):
    with SparqlServer(sample_catalogue()) as endpoint:  # the 18 real datasets, unchanged
        harvest.configure(endpoint.url, type="dcat-sparql", page_size=5)
        assert harvest.run().state == "success"
        everything = live_ids(db)
        assert len(everything) == 18
        endpoint.remove("https://dati.unibo.it/dataset/0824deeb-8e76-4281-9120-c2177d0b13ca")
        endpoint.ignore_filter = True  # every page is the first again: the cursor never advances
        dag_run = harvest.run(full_sync=True)
    assert dag_run.state == "failed"
    _, _, status, _, error = last_run(db)
    assert status == "failed" and "cut short" in error, error
    assert "not past it" in caplog.text
    assert live_ids(db) == everything  # nothing removed on a listing that looped
