"""Staging tables hold nothing of a committed run, not even pages (issue 40): a first sync's staged
records and changes are KBs a dataset, and deleted rows keep their pages (a vacuum never hands an
index's back). store/staging.py release: the table truncated when no other run's rows are there
and it can be locked at once; else only the run's rows deleted, never a wait. Real PostgreSQL, the
local CKAN portal, the local Gemini-protocol server."""
import psycopg
import pytest

from harvester.config.portals import Portal
from harvester.embeddings import get_provider
from harvester.pipeline import steps as pipeline
from harvester.store import history, staging
from harvester.testing.samples import distinct_records


def pages(db, table):
    """The table's bytes on disk: heap, TOAST and indexes."""
    return db.execute("SELECT pg_total_relation_size(%s::regclass)", (table,)).fetchone()[0]


def heap_and_toast(db, table):
    """The bytes of the table's rows: its heap and its TOAST heap (indexes apart)."""
    return db.execute("SELECT pg_relation_size(c.oid) + coalesce(pg_relation_size(nullif(c.reltoastrelid, 0)), 0)"
                      " FROM pg_class c WHERE c.oid = %s::regclass", (table,)).fetchone()[0]


def empty_size(db, table):
    """What the table takes right after a TRUNCATE: a metapage for each index and the TOAST's index."""
    return 8192 * db.execute("SELECT count(*) + 1 FROM pg_index WHERE indrelid = %s::regclass", (table,)).fetchone()[0]


def test_a_committed_run_leaves_no_staged_rows_nor_pages(db, reader, portal_server, samples, gemini):
    portal_server.set_records(distinct_records(samples, 60))
    portal = Portal(name="staged", url=portal_server.base_url, politeness_delay=0, page_size=20)
    out = pipeline.harvest(db, reader, portal, pipeline.source_for(portal), get_provider(), full_sync=True)
    assert out["created"] == 60
    for table in staging.RUN_TABLES:
        assert db.execute(f"SELECT count(*) FROM {table}").fetchone()[0] == 0, table
        # heap and TOAST gone: the staged changes' 60 snapshots were deleted row by row before
        assert heap_and_toast(db, table) == 0, table
        assert db.execute(
            "SELECT count(*) FROM pg_index i WHERE i.indrelid = %s::regclass AND pg_relation_size(i.indexrelid) > 16384",
            (table,)).fetchone()[0] == 0, table
    # the history is whole: one current version each
    assert db.execute("SELECT count(*) FROM dataset_versions WHERE is_current").fetchone()[0] == 60


def _runs(db, n):
    return [db.execute("INSERT INTO sync_runs (portal_url, portal_name, mode, status) VALUES (%s, %s, 'full',"
                       " 'running') RETURNING run_id", (f"https://p{i}.example", f"p{i}")).fetchone()[0]
            for i in range(n)]


def _stage_changes(db, run_id, n):
    db.execute("INSERT INTO staging_changes (run_id, source_id, change_type, significance, requires_review, old_snapshot,"
               " new_version, record_change) SELECT %s, 's' || g, 'new', 0, false,"
               " jsonb_build_object('title', repeat('x', 3000)), true, true FROM generate_series(1, %s) g",
               (run_id, n))


def test_release_keeps_other_runs_rows_and_never_waits(db, database_url):
    mine, other = _runs(db, 2)
    _stage_changes(db, mine, 50)
    _stage_changes(db, other, 30)
    # another run's rows are there: only this run's go
    assert staging.release(db, "staging_changes", mine) == 50
    assert db.execute("SELECT run_id, count(*) FROM staging_changes GROUP BY run_id").fetchall() == [(other, 30)]
    # the table in use elsewhere (a scan, a COPY, a vacuum): deleted at once rather than waited for
    with psycopg.connect(database_url) as busy:
        busy.execute("SELECT count(*) FROM staging_changes").fetchone()  # ACCESS SHARE to its commit
        assert staging.release(db, "staging_changes", other) == 30
    assert db.execute("SELECT count(*) FROM staging_changes").fetchone()[0] == 0
    assert pages(db, "staging_changes") > empty_size(db, "staging_changes")  # deleted rows keep their pages
    # the next run that finds the table to itself truncates it, its own rows and the dead ones
    _stage_changes(db, mine, 5)
    history.clear(db, mine)
    assert heap_and_toast(db, "staging_changes") == 0
    assert pages(db, "staging_changes") == empty_size(db, "staging_changes")
    # inside a caller's transaction the truncation holds its lock to the caller's commit
    _stage_changes(db, other, 5)
    with db.transaction():
        assert staging.release(db, "staging_changes", other) == 5
        with psycopg.connect(database_url, autocommit=True) as late:
            late.execute("SET lock_timeout = '100ms'")
            with pytest.raises(psycopg.errors.LockNotAvailable):
                late.execute("SELECT count(*) FROM staging_changes")


def test_release_names_only_staging_tables(db):
    with pytest.raises(ValueError, match="'datasets' is not a staging table"):
        staging.release(db, "datasets", 1)


def test_an_emptied_index_is_handed_back_even_when_a_vacuum_truncated_the_heap(db):
    """A vacuum truncates a table whose rows were all deleted, but never hands an index's pages
    back: the next release truncates the table all the same."""
    (run,) = _runs(db, 1)
    _stage_changes(db, run, 2000)
    db.execute("DELETE FROM staging_changes")
    db.execute("VACUUM staging_changes")
    assert heap_and_toast(db, "staging_changes") == 0 and pages(db, "staging_changes") > empty_size(db, "staging_changes")
    assert staging.release(db, "staging_changes", run) == 0
    assert pages(db, "staging_changes") == empty_size(db, "staging_changes")
