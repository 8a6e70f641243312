"""Migrations 031 and 032 (the current version's snapshot held once, by the dataset's row; issue 40's
storage goal) on a database as the code before them left it: every stored snapshot kept, the view
and `v.title` read as before. How runs write and read versions since: tests/store/test_history.py."""
import psycopg

from harvester.store import migrations


def test_031_and_032_keep_every_stored_snapshot_and_read_the_row_where_none_is(empty_database_url, migrate_before):
    """A database as the code before 031 left it: every version with its snapshot, one current
    snapshot differing from its row. The migrations NULL nothing; the view and v.title read as before."""
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        migrate_before(conn, 31)
        conn.execute("INSERT INTO datasets (portal_url, source_id, url, url_hash, content_hash, metadata_hash, title,"
                     " description, first_seen_at, updated_at, last_seen_at, raw) VALUES"
                     " ('https://p.example', 'a', 'u', 'h', 'cc', 'm', 'Today''s title', 'notes', now(), now(), now(),"
                     " '{}')")
        conn.execute("INSERT INTO dataset_versions (dataset_id, version_number, content_hash, metadata_hash, snapshot,"
                     " is_current, change_type, first_seen_at, last_seen_at)"
                     " SELECT id, n, 'cc', 'm', jsonb_build_object('title', 'Title ' || n, 'description', 'stored',"
                     " 'fields', jsonb_build_object('tracked_then', n)), n = 2, 'new', now(), now()"
                     " FROM datasets, generate_series(1, 2) n")
        before = conn.execute("SELECT version_number, is_current, snapshot FROM dataset_versions ORDER BY 1").fetchall()
        assert migrations.migrate(conn)[:2] == ["031_current_snapshot_once.sql", "032_current_snapshot_readers.sql"]
        assert conn.execute("SELECT version_number, is_current, snapshot FROM dataset_versions ORDER BY 1"
                            ).fetchall() == before
        assert conn.execute("SELECT v.title, v.description FROM dataset_versions v ORDER BY v.version_number"
                            ).fetchall() == [("Title 1", "stored"), ("Title 2", "stored")]
        # the view reads the dataset's row, and has no snapshot column any more
        assert conn.execute("SELECT version_number, title, description FROM current_datasets").fetchall() == [
            (2, "Today's title", "notes")]
        assert "snapshot" not in {c.name for c in conn.execute("SELECT * FROM current_datasets LIMIT 0").description}
        # a current version without a snapshot reads its dataset's
        conn.execute("UPDATE dataset_versions SET snapshot = NULL WHERE is_current")
        assert conn.execute("SELECT v.title, v.description FROM dataset_versions v WHERE v.is_current").fetchone() == (
            "Today's title", "notes")
        # staging_changes takes what today's writer stages
        assert {"old_snapshot", "forget_snapshot"} <= {c.name for c in conn.execute(
            "SELECT * FROM staging_changes LIMIT 0").description}
