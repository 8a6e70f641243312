"""The store on a real PostgreSQL: migrations, run lifecycle, per-model vector indexes."""
from types import SimpleNamespace

import psycopg
import pytest

from harvester.config.portals import Portal
from harvester.store import migrations, runs, vectors


@pytest.fixture
def empty_db(empty_database_url):
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        yield conn


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
            "removed_at", "embedded_content_hash", "raw"} <= columns


def test_badly_named_migration_is_refused(tmp_path, empty_db):
    (tmp_path / "1_first.sql").write_text("SELECT 1")
    with pytest.raises(RuntimeError, match="migration file 1_first.sql must be named NNN_description.sql"):
        migrations.migrate(empty_db, tmp_path)


def test_a_retried_begin_reuses_its_run_and_another_writer_is_refused(db):
    first = runs.start(db, portal_url="https://p.org", portal_name="p", dag_run_id="a", mode="full", since=None)
    again = runs.start(db, portal_url="https://p.org", portal_name="p", dag_run_id="a", mode="full", since=None)
    assert again.run_id == first.run_id
    with pytest.raises(runs.RunInProgress, match=rf"p is being harvested by run {first.run_id} .*by DAG run a\b"):
        runs.start(db, portal_url="https://p.org", portal_name="p", dag_run_id="b", mode="full", since=None)
    with pytest.raises(runs.RunInProgress, match="--takeover"):
        runs.start(db, portal_url="https://p.org", portal_name="p", dag_run_id=None, mode="full", since=None)
    assert runs.get(db, first.run_id).status == "running"


def test_a_run_with_no_progress_for_stale_after_is_abandoned_by_the_next(db):
    dead = runs.start(db, portal_url="https://p.org", portal_name="p", dag_run_id=None, mode="full", since=None)
    db.execute("INSERT INTO staging_records (run_id, seq, source_id) VALUES (%s, 0, 'x')", (dead.run_id,))
    db.execute("UPDATE sync_runs SET heartbeat_at = now() - interval '119 minutes' WHERE run_id = %s", (dead.run_id,))
    with pytest.raises(runs.RunInProgress):  # still within stale_after (2h)
        runs.start(db, portal_url="https://p.org", portal_name="p", dag_run_id="b", mode="full", since=None)
    db.execute("UPDATE sync_runs SET heartbeat_at = now() - interval '121 minutes' WHERE run_id = %s", (dead.run_id,))
    new = runs.start(db, portal_url="https://p.org", portal_name="p", dag_run_id="b", mode="full", since=None)
    status, error = db.execute("SELECT status, error FROM sync_runs WHERE run_id = %s", (dead.run_id,)).fetchone()
    assert status == "abandoned" and "no progress for 2h 1m" in error and "DAG run b went ahead" in error
    assert db.execute("SELECT count(*) FROM staging_records").fetchone()[0] == 0
    assert runs.get(db, new.run_id).status == "running"


def test_takeover_aborts_the_running_run(db):
    held = runs.start(db, portal_url="https://p.org", portal_name="p", dag_run_id="a", mode="full", since=None)
    mine = runs.start(db, portal_url="https://p.org", portal_name="p", dag_run_id=None, mode="full", since=None,
                      takeover=True)
    status, error = db.execute("SELECT status, error FROM sync_runs WHERE run_id = %s", (held.run_id,)).fetchone()
    assert status == "cancelled" and "aborted on request (takeover)" in error and "the CLI went ahead" in error
    assert runs.get(db, mine.run_id).status == "running"


def test_dag_timeout_marks_the_run_cancelled_keeps_its_staging_for_resuming_and_the_watermark(db, database_url):
    from harvester.pipeline import tasks

    portal = Portal(name="p", url="https://p.org")
    run = runs.start(db, portal_url=portal.url, portal_name="p", dag_run_id="scheduled__1", mode="full", since=None)
    db.execute("INSERT INTO staging_records (run_id, seq, source_id) VALUES (%s, 0, 'x')", (run.run_id,))
    tasks.on_dag_failure(portal)({"dag_run": SimpleNamespace(run_id="scheduled__1"), "reason": "timed_out"})
    assert db.execute("SELECT status, resumable FROM sync_runs WHERE run_id = %s",
                      (run.run_id,)).fetchone() == ("cancelled", True)
    assert db.execute("SELECT count(*) FROM staging_records").fetchone()[0] == 1
    assert db.execute("SELECT last_successful_sync, sync_status FROM portal_sync_status").fetchone() == (None, "cancelled")
    # Cleared in Airflow: the same DAG run reopens the run, staging intact.
    assert runs.resume(db, run.run_id, "scheduled__1").status == "running"
    assert db.execute("SELECT count(*) FROM staging_records").fetchone()[0] == 1


def test_the_next_run_supersedes_a_resumable_run(db):
    old = runs.start(db, portal_url="https://p.org", portal_name="p", dag_run_id="a", mode="full", since=None)
    db.execute("INSERT INTO staging_records (run_id, seq, source_id) VALUES (%s, 0, 'x')", (old.run_id,))
    runs.abort(db, old.run_id, "failed", "boom", resumable=True)
    with pytest.raises(runs.NotResumable, match="belongs to DAG run a"):
        runs.resume(db, old.run_id, "b")
    new = runs.start(db, portal_url="https://p.org", portal_name="p", dag_run_id="b", mode="full", since=None)
    assert db.execute("SELECT count(*) FROM staging_records").fetchone()[0] == 0
    with pytest.raises(runs.NotResumable, match=rf"run {old.run_id} of p is failed and cannot be resumed "
                                                rf"\(its staging is gone; boom \(superseded by run {new.run_id}"):
        runs.resume(db, old.run_id, "a")
    # A CLI run's failure never keeps staging: nobody could clear it.
    runs.abort(db, new.run_id, "failed", "x", resumable=True)
    cli = runs.start(db, portal_url="https://p.org", portal_name="p", dag_run_id=None, mode="full", since=None)
    runs.abort(db, cli.run_id, "failed", "boom", resumable=True)
    assert runs.get(db, cli.run_id).resumable is False


def test_each_model_gets_its_own_hnsw_index(db):
    vectors.ensure_index(db, "small-model", 384)
    vectors.ensure_index(db, "big-model@3072", 3072)
    vectors.ensure_index(db, "small-model", 384)
    defs = dict(db.execute("SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'embeddings'"
                           " AND indexname LIKE 'embeddings_hnsw_%'").fetchall())
    assert len(defs) == 2
    small, big = defs[vectors.index_name("small-model")], defs[vectors.index_name("big-model@3072")]
    assert "halfvec(384)" in small and f"WHERE (model = {vectors.model_id(db, 'small-model')})" in small
    assert "halfvec(3072)" in big


def test_vectors_of_the_wrong_dimension_are_refused(db):
    with pytest.raises(ValueError, match=r"returned a vector of shape \(3,\), expected \(4,\)"):
        vectors.write(db, "m", 4, ["0a"], [[0.1, 0.2, 0.3]])
    assert db.execute("SELECT count(*) FROM embeddings").fetchone()[0] == 0


def test_a_retried_upsert_of_a_committed_run_changes_nothing(db, portal_server, samples):
    from harvester.pipeline import steps as pipeline
    from harvester.store import db as store_db

    portal_server.set_records(samples("data-gov-au.jsonl"))
    portal = Portal(name="p", url=portal_server.base_url, politeness_delay=0)
    run_id = pipeline.begin(db, portal)["run_id"]
    pipeline.fetch_modified(db, portal, run_id, pipeline.source_for(portal))
    with store_db.connect_url(db.info.dsn) as reader:
        pipeline.hash_compare(db, reader, portal, run_id)
    first = pipeline.upsert(db, portal, run_id, "no-model")
    watermark = runs.watermark(db, portal.url)
    again = pipeline.upsert(db, portal, run_id, "no-model")
    assert again == first and runs.watermark(db, portal.url) == watermark
    assert db.execute("SELECT count(*) FROM dataset_versions").fetchone()[0] == first["created"]
