"""Embeddings in real runs: exact batching, the shared circuit breaker under a 429 storm, the
content-addressed cache across portals and failed runs, fail-fast on a bad key. The real
google-genai SDK talks HTTP to a local server that speaks Gemini's REST API."""
import json
import logging
import threading

import pytest

from harvester.domain import dataset as ds
from harvester.pipeline import steps as pipeline
from harvester.config.portals import Portal
from harvester.store import db as store_db
from harvester.testing.clock import pass_breaker_time
from harvester.testing.samples import distinct_records


def batch_sizes(fake):
    return [len(body["requests"]) for _, _, body in fake.requests]


def last_run(db):
    return db.execute("SELECT run_id, mode, status, stats, error FROM sync_runs ORDER BY run_id DESC LIMIT 1").fetchone()


def test_250_new_texts_take_exactly_3_requests(harvest, portal_server, db, samples, gemini):
    portal_server.set_records(distinct_records(samples, 250))
    harvest.configure(portal_server.base_url)
    assert harvest.run().state == "success"
    _, _, status, stats, _ = last_run(db)
    assert status == "committed"
    assert (stats["embedding_requests"], stats["embedded"], stats["skipped"]) == (3, 250, 0)
    assert sorted(batch_sizes(gemini)) == [50, 100, 100]  # (in flight at once: they arrive in any order)
    assert db.execute("SELECT DISTINCT m.name, e.dimension FROM embeddings e"
                      " JOIN embedding_models m ON m.id = e.model").fetchall() == [("gemini-embedding-001@768", 768)]
    # Each text was sent once and only once.
    assert len(gemini.texts) == len(set(gemini.texts)) == 250


def test_unusable_vectors_spoil_only_their_texts_and_the_dag_run_succeeds_first_try(harvest, portal_server, db,
                                                                                       samples, gemini):
    """Issue 36: NaN (and empty) vectors for a few texts used to fail embed_changed, cancelling the
    batches in flight, and Airflow's retry sent every text again."""
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    records = distinct_records(samples, 400)
    portal_server.set_records(records)
    harvest.configure(portal_server.base_url)
    for record, how in zip(records[:3], ("nan", "empty", "inf")):
        gemini.poison(ds.embedding_text(record["title"], record.get("notes")), how)
    dag_run = harvest.run()
    assert dag_run.state == "success"
    _, _, status, stats, _ = last_run(db)
    assert (status, stats["embedded"], stats["embeddings_refused"], stats["skipped"]) == ("committed", 397, 3, 3)
    assert stats["embedding_requests"] == len(gemini.requests) == 4, "no batch sent twice"
    assert len(gemini.texts) == len(set(gemini.texts)) == 400
    with create_session() as session:
        ti = session.query(TaskInstance).filter_by(run_id=dag_run.run_id, task_id="embed_changed").one()
        assert ti.state == "success" and ti.try_number == 1
    assert db.execute("SELECT count(*) FROM circuit_breakers WHERE consecutive_failures > 0").fetchone()[0] == 0


def test_invalid_key_fails_fast_without_showing_the_key(harvest, portal_server, db, samples, gemini, monkeypatch):
    secret = "AIza-REVOKED-SECRET-31337"
    monkeypatch.setenv("GEMINI_API_KEY", secret)
    monkeypatch.setenv("HARVESTER_TASK_RETRIES", "2")
    monkeypatch.setenv("HARVESTER_TASK_RETRY_DELAY_SECS", "1")
    portal_server.set_records(samples("data-birmingham-gov-uk.jsonl"))
    harvest.configure(portal_server.base_url)
    dag_run = harvest.run()
    assert dag_run.state == "failed"
    _, _, status, stats, error = last_run(db)
    assert status == "failed"
    assert "Gemini rejected the API key" in error and secret not in error
    assert len(gemini.requests) == 1, "a bad key is not retried"
    assert db.execute("SELECT count(*) FROM datasets").fetchone()[0] == 0
    assert db.execute("SELECT count(*) FROM circuit_breakers WHERE state <> 'closed'").fetchone()[0] == 0
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    with create_session() as session:
        ti = session.query(TaskInstance).filter_by(run_id=dag_run.run_id, task_id="embed_changed").one()
        assert ti.state == "failed" and ti.try_number == 1


def test_a_failed_runs_vectors_are_reused_by_its_retry(harvest, portal_server, db, samples, gemini, monkeypatch):
    monkeypatch.setenv("HARVESTER_EMBED_CONCURRENCY", "1")  # the batches in order: the last one is refused
    portal_server.set_records(distinct_records(samples, 250))
    harvest.configure(portal_server.base_url)
    gemini.fail_next(2, status=None)    # two batches go through...
    gemini.fail_next(1, status=401)     # ...then the key is refused: the run fails
    assert harvest.run().state == "failed"
    assert last_run(db)[2] == "failed"
    assert db.execute("SELECT count(*) FROM embeddings").fetchone()[0] == 200
    assert db.execute("SELECT count(*) FROM datasets").fetchone()[0] == 0

    gemini.requests.clear()
    assert harvest.run().state == "success"
    _, _, status, stats, _ = last_run(db)
    assert status == "committed"
    assert (stats["embedding_requests"], stats["embedded"], stats["embeddings_reused"]) == (1, 50, 200)
    assert stats["embedding_calls_saved"] == 2 and stats["embedding_tokens_saved"] > 0
    assert batch_sizes(gemini) == [50]


def test_a_cross_portal_duplicate_costs_no_request(database_url, samples, gemini, tmp_path, monkeypatch, capsys):
    import yaml

    from harvester.cli.main import main
    from harvester.testing.ckan_portal import DemoPortal

    records = samples("data-birmingham-gov-uk.jsonl")
    with DemoPortal(records) as first, DemoPortal(records) as second:
        path = tmp_path / "portals.yaml"
        path.write_text(yaml.safe_dump({"portals": [
            {"name": "first", "url": first.base_url, "politeness_delay": 0},
            {"name": "second", "url": second.base_url, "politeness_delay": 0}]}))
        monkeypatch.setenv("HARVESTER_PORTALS_FILE", str(path))
        assert main(["harvest", "first", "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["embedded"] == len(records)
        requests_before = len(gemini.requests)
        assert main(["harvest", "second", "--json"]) == 0
        stats = json.loads(capsys.readouterr().out)
    assert len(gemini.requests) == requests_before
    assert (stats["created"], stats["embedding_requests"], stats["embedded"]) == (len(records), 0, 0)
    assert stats["embeddings_reused"] == len(records)
    assert main(["stats", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    by_portal = {p["portal"]: p for p in report["portals"]}
    assert by_portal["second"]["hit_rate"] == 1.0 and by_portal["first"]["hit_rate"] == 0.0
    assert by_portal["second"]["with_vector"] == by_portal["second"]["datasets"] == len(records)
    assert report["cache"]["models"] == [{"model": "gemini-embedding-001@768", "dimension": 768,
                                         "vectors": len(records)}]


def test_a_429_storm_opens_the_breaker_for_every_task_and_the_next_run_embeds(
        harvest, portal_server, db, database_url, samples, gemini, monkeypatch, caplog):
    """Two portals embed at once; the API answers 429 to everything. The shared breaker opens
    after 5 failures for both, both runs commit with their datasets Skipped, and the next run
    embeds them even though the portal reports no change."""
    from harvester.testing.ckan_portal import DemoPortal
    from harvester.embeddings import get_provider

    monkeypatch.setenv("CB_FAILURE_THRESHOLD", "5")
    monkeypatch.setenv("CB_RECOVERY_TIMEOUT_SECS", "1")
    records = distinct_records(samples, 500)
    portal_server.set_records(records[:250])
    other_server = DemoPortal(records[250:]).__enter__()
    portals = [Portal(name="test", url=portal_server.base_url, politeness_delay=0),
               Portal(name="other", url=other_server.base_url, politeness_delay=0)]
    gemini.fail_next(10_000, status=429, retry_after=0)
    results, errors = {}, []
    barrier = threading.Barrier(2)

    def run(portal):
        try:
            with store_db.open_cli() as conn, store_db.open_cli() as reader:
                run_id = pipeline.begin(conn, portal)["run_id"]
                pipeline.fetch_modified(conn, portal, run_id, pipeline.source_for(portal))
                pipeline.hash_compare(conn, reader, portal, run_id)
                barrier.wait(timeout=30)
                provider = get_provider()
                pipeline.embed_changed(conn, reader, portal, run_id, provider)
                results[portal.name] = pipeline.upsert(conn, portal, run_id, provider.model, provider.max_batch)
        except Exception as exc:  # surfaced below
            errors.append(exc)

    caplog.set_level(logging.WARNING, logger="harvester.store.breaker")
    threads = [threading.Thread(target=run, args=(p,)) for p in portals]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    finally:
        other_server.__exit__(None, None, None)
    assert not errors, errors
    # Five failures opened it; at most the calls then in flight (3 per task, less the fifth) followed.
    assert 5 <= len(gemini.requests) <= 5 + 2 * 3 - 1
    for name in ("test", "other"):
        stats = results[name]
        assert (stats["created"], stats["skipped"], stats["embedded"]) == (250, 250, 0)
    state = db.execute("SELECT state, consecutive_failures FROM circuit_breakers").fetchone()
    assert state[0] == "open" and state[1] >= 5
    openings = [r for r in caplog.records if "CLOSED -> OPEN" in r.getMessage()]
    assert len(openings) == 1 and openings[0].levelno == logging.WARNING
    assert db.execute("SELECT count(*) FROM datasets WHERE embedded_content_hash IS DISTINCT FROM content_hash"
                      ).fetchone()[0] == 500

    # The API recovers; the breaker's recovery timeout (1s, doubled for a 429) passes.
    gemini._fail.clear()
    gemini.requests.clear()
    pass_breaker_time(db, 2)
    harvest.configure(portal_server.base_url)
    assert harvest.run().state == "success"
    _, mode, status, stats, _ = last_run(db)
    assert (mode, status, stats["fetched"], stats["created"]) == ("incremental", "committed", 0, 0)
    assert (stats["embedded"], stats["embedding_requests"], stats["skipped"]) == (250, 3, 0)
    assert db.execute("SELECT state FROM circuit_breakers").fetchone()[0] == "closed"
    pending = dict(db.execute("SELECT portal_url, count(*) FILTER (WHERE embedded_content_hash IS DISTINCT FROM"
                              " content_hash) FROM datasets GROUP BY portal_url").fetchall())
    assert pending == {portals[0].url: 0, portals[1].url: 250}


def test_embed_changed_fans_out_over_shards_and_each_text_is_sent_once(harvest, portal_server, db, samples, gemini,
                                                                        monkeypatch):
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    monkeypatch.setenv("HARVESTER_EMBED_SHARD_SIZE", "100")
    portal_server.set_records(distinct_records(samples, 250))
    harvest.configure(portal_server.base_url)
    dag_run = harvest.run()
    assert dag_run.state == "success"
    with create_session() as session:
        mapped = session.query(TaskInstance).filter_by(run_id=dag_run.run_id, task_id="embed_changed").all()
        assert sorted(ti.map_index for ti in mapped) == [0, 1, 2]
        assert {ti.state for ti in mapped} == {"success"}
    _, _, status, stats, _ = last_run(db)
    assert (status, stats["embedded"], stats["skipped"]) == ("committed", 250, 0)
    assert stats["embedding_requests"] == len(gemini.requests) == 3
    assert len(gemini.texts) == len(set(gemini.texts)) == 250


# -- Ollama: an outage defers embeddings exactly like a Gemini outage --------------------------------
@pytest.fixture
def ollama(monkeypatch):
    from harvester.testing.ollama import FakeOllama

    with FakeOllama(models={"nomic-embed-text": 768}) as fake:
        monkeypatch.setenv("HARVESTER_EMBEDDING_PROVIDER", "ollama")
        monkeypatch.setenv("OLLAMA_URL", fake.url)
        monkeypatch.setenv("HARVESTER_EMBED_RETRY_DELAY_SECS", "0")
        for name in ("OLLAMA_EMBEDDING_MODEL", "OLLAMA_EMBEDDING_DIMENSION", "OLLAMA_MAX_BATCH"):
            monkeypatch.delenv(name, raising=False)  # the dimension is learnt by a probe request
        yield fake


def pending_datasets(db):
    return db.execute("SELECT count(*) FROM datasets WHERE embedded_content_hash IS DISTINCT FROM content_hash"
                      ).fetchone()[0]


def test_an_ollama_outage_opens_the_breaker_at_the_dimension_probe_and_the_run_commits(
        harvest, portal_server, db, samples, ollama, monkeypatch):
    monkeypatch.setenv("CB_FAILURE_THRESHOLD", "2")
    monkeypatch.setenv("CB_RECOVERY_TIMEOUT_SECS", "1")
    records = samples("data-birmingham-gov-uk.jsonl")
    portal_server.set_records(records)
    harvest.configure(portal_server.base_url)
    ollama.fail_next(10_000, status=503)
    assert harvest.run().state == "success"
    _, _, status, stats, _ = last_run(db)
    assert status == "committed"
    # Two failed probes opened the shared breaker; the third attempt was never sent.
    assert (stats["created"], stats["skipped"], stats["embedded"], stats["embedding_requests"]) == (len(records),
                                                                                                 len(records), 0, 2)
    assert len(ollama.requests) == 2
    assert db.execute("SELECT provider, model, state FROM circuit_breakers").fetchall() == [
        ("ollama", "ollama/nomic-embed-text", "open")]
    assert pending_datasets(db) == len(records)

    # Ollama recovers; once the breaker lets probes through, the next run embeds what was left.
    ollama._fail.clear()
    ollama.requests.clear()
    pass_breaker_time(db, 1)
    assert harvest.run().state == "success"
    _, _, status, stats, _ = last_run(db)
    assert (status, stats["fetched"], stats["embedded"], stats["skipped"]) == ("committed", 0, len(records), 0)
    assert stats["embedding_requests"] == len(ollama.requests) == 2  # the probe and one batch
    assert db.execute("SELECT state FROM circuit_breakers").fetchone()[0] == "closed"
    assert db.execute("SELECT DISTINCT m.name, e.dimension FROM embeddings e"
                      " JOIN embedding_models m ON m.id = e.model").fetchall() == [("ollama/nomic-embed-text", 768)]
    assert pending_datasets(db) == 0


def test_an_unreachable_ollama_leaves_the_texts_pending_and_the_run_commits(harvest, portal_server, db, samples,
                                                                             ollama, monkeypatch):
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setenv("OLLAMA_URL", f"http://127.0.0.1:{port}")  # nothing listens there
    records = samples("data-birmingham-gov-uk.jsonl")
    portal_server.set_records(records)
    harvest.configure(portal_server.base_url)
    assert harvest.run().state == "success"
    _, _, status, stats, _ = last_run(db)
    assert (status, stats["created"], stats["skipped"], stats["embedded"]) == ("committed", len(records),
                                                                               len(records), 0)
    assert stats["embedding_requests"] == 3  # HARVESTER_EMBED_ATTEMPTS probes, each counted by the breaker
    assert db.execute("SELECT state, consecutive_failures FROM circuit_breakers WHERE provider = 'ollama'"
                      ).fetchone() == ("closed", 3)
    assert pending_datasets(db) == len(records)
