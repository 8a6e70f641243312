"""The store on a real PostgreSQL: migrations, run lifecycle, per-model vector indexes."""
import uuid
from types import SimpleNamespace

import psycopg
import pytest

from harvester.portal import Portal
from harvester.store import migrations, runs, vectors


@pytest.fixture
def empty_db(pg_server):
    name = f"e_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg_server.url("postgres"), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    conn = psycopg.connect(pg_server.url(name), autocommit=True)
    yield conn
    conn.close()
    with psycopg.connect(pg_server.url("postgres"), autocommit=True) as admin:
        admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


def test_migrations_apply_once_in_order(empty_db):
    names = [path.name for _, path in migrations.migration_files()]
    assert names[0] == "001_initial.sql" and names == sorted(names)
    assert migrations.migrate(empty_db) == names
    assert migrations.migrate(empty_db) == []
    assert [r[1] for r in empty_db.execute("SELECT version, name FROM schema_migrations ORDER BY version")] == names
    tables = {r[0] for r in empty_db.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")}
    assert {"portal_sync_status", "sync_runs", "datasets", "embeddings", "staging_records"} <= tables
    columns = {r[0] for r in empty_db.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_name = 'datasets'")}
    assert {"portal_url", "source_id", "name", "url", "url_hash", "content_hash", "metadata_hash", "title",
            "description", "tags", "organization", "metadata_modified", "first_seen_at", "updated_at",
            "last_seen_at", "removed_at", "embedded_content_hash", "raw"} <= columns


def test_badly_named_migration_is_refused(tmp_path, empty_db):
    (tmp_path / "1_first.sql").write_text("SELECT 1")
    with pytest.raises(RuntimeError, match="migration file 1_first.sql must be named NNN_description.sql"):
        migrations.migrate(empty_db, tmp_path)


def test_a_retried_begin_reuses_its_run_and_a_dead_run_is_closed(db):
    first = runs.start(db, portal_url="https://p.org", portal_name="p", dag_run_id="a", mode="full", since=None)
    again = runs.start(db, portal_url="https://p.org", portal_name="p", dag_run_id="a", mode="full", since=None)
    assert again.run_id == first.run_id
    other = runs.start(db, portal_url="https://p.org", portal_name="p", dag_run_id="b", mode="full", since=None)
    assert other.run_id != first.run_id
    status, error = db.execute("SELECT status, error FROM sync_runs WHERE run_id = %s", (first.run_id,)).fetchone()
    assert status == "failed" and error.startswith("abandoned")


def test_dag_timeout_marks_the_run_cancelled_and_keeps_the_watermark(db, database_url):
    from harvester import tasks

    portal = Portal(name="p", url="https://p.org")
    run = runs.start(db, portal_url=portal.url, portal_name="p", dag_run_id="scheduled__1", mode="full", since=None)
    db.execute("INSERT INTO staging_records (run_id, seq, source_id) VALUES (%s, 0, 'x')", (run.run_id,))
    tasks.on_dag_failure(portal)({"dag_run": SimpleNamespace(run_id="scheduled__1"), "reason": "timed_out"})
    assert db.execute("SELECT status FROM sync_runs WHERE run_id = %s", (run.run_id,)).fetchone()[0] == "cancelled"
    assert db.execute("SELECT count(*) FROM staging_records").fetchone()[0] == 0
    assert db.execute("SELECT last_successful_sync, sync_status FROM portal_sync_status").fetchone() == (None, "cancelled")


def test_each_model_gets_its_own_hnsw_index(db):
    vectors.ensure_index(db, "small-model", 384)
    vectors.ensure_index(db, "big-model@3072", 3072)
    vectors.ensure_index(db, "small-model", 384)
    defs = dict(db.execute("SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'embeddings'"
                           " AND indexname LIKE 'embeddings_hnsw_%'").fetchall())
    assert len(defs) == 2
    small, big = defs[vectors.index_name("small-model")], defs[vectors.index_name("big-model@3072")]
    assert "vector(384)" in small and "'small-model'" in small
    assert "halfvec(3072)" in big


def test_vectors_of_the_wrong_dimension_are_refused(db):
    with pytest.raises(ValueError, match=r"returned a vector of shape \(3,\), expected \(4,\)"):
        vectors.write(db, "m", 4, ["h"], [[0.1, 0.2, 0.3]])
    assert db.execute("SELECT count(*) FROM embeddings").fetchone()[0] == 0


def test_a_retried_upsert_of_a_committed_run_changes_nothing(db, portal_server, samples):
    from harvester import pipeline
    from harvester.store import db as store_db

    portal_server.set_records(samples("data-gov-au.jsonl"))
    portal = Portal(name="p", url=portal_server.base_url, politeness_delay=0)
    run_id = pipeline.begin(db, portal)["run_id"]
    pipeline.fetch_modified(db, portal, run_id, pipeline.client_for(portal))
    with store_db.connect_url(db.info.dsn) as reader:
        pipeline.hash_compare(db, reader, portal, run_id)
    first = pipeline.upsert(db, portal, run_id, "no-model")
    watermark = runs.watermark(db, portal.url)
    again = pipeline.upsert(db, portal, run_id, "no-model")
    assert again == first and runs.watermark(db, portal.url) == watermark
    assert db.execute("SELECT count(*) FROM dataset_versions").fetchone()[0] == first["created"]
