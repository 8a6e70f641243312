"""Schema migrations: each in its own transaction under a transaction-level advisory lock, applied
by `harvester db migrate` and by whichever task of a run comes first (a deploy while runs are in
flight), waiting a bounded time for their locks."""
from __future__ import annotations

import hashlib
import logging
from datetime import datetime, timezone

import psycopg
import pytest

from harvester.store import migrations


def tables(conn) -> set[str]:
    return {r[0] for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")}


def applied(conn) -> list[str]:
    return [r[0] for r in conn.execute("SELECT name FROM schema_migrations ORDER BY version")]


def test_each_migration_in_its_own_transaction(empty_database_url, tmp_path):
    (tmp_path / "001_first.sql").write_text("CREATE TABLE first_table (x int);")
    (tmp_path / "002_second.sql").write_text("CREATE TABLE second_table (x int);")
    (tmp_path / "003_third.sql").write_text("CREATE TABLE third_table (x int);\nSELECT 1 / 0;")
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        with pytest.raises(migrations.MigrationError) as failed:
            migrations.migrate(conn, tmp_path)
        assert str(failed.value).startswith(
            "migration 003_third.sql failed and was rolled back; applied before it: 001_first.sql, 002_second.sql: "
            "DivisionByZero")
        # The earlier ones stay applied and recorded; the failing one left nothing behind.
        assert applied(conn) == ["001_first.sql", "002_second.sql"]
        assert {"first_table", "second_table"} <= tables(conn) and "third_table" not in tables(conn)
        # The lock is released: fixed, the next migrate applies just the rest.
        (tmp_path / "003_third.sql").write_text("CREATE TABLE third_table (x int);")
        assert migrations.migrate(conn, tmp_path) == ["003_third.sql"]
        assert migrations.pending(conn, tmp_path) == []


@pytest.mark.parametrize("autocommit", [True, False])
def test_a_table_a_migration_wrote_anew_is_vacuumed_once_it_has_committed(empty_database_url, tmp_path, caplog,
                                                                          autocommit):
    """A migration naming a table on a "--! vacuum after:" line: once it has committed, the table is
    vacuumed (an ALTER TABLE ... TYPE leaves no page all-visible, and autovacuum sees nothing to do),
    on an autocommit connection or not; an empty one is left without statistics, as a new database's
    tables are. A VACUUM that fails is a warning naming the table; the migration stays applied and
    the next one runs."""
    first, every = tmp_path / "first", tmp_path / "every"
    first.mkdir()
    every.mkdir()
    for directory in (first, every):
        (directory / "001_first.sql").write_text(
            "CREATE TABLE first_table AS SELECT g AS x FROM generate_series(1, 5000) g;")
    (every / "002_second.sql").write_text(
        "ALTER TABLE first_table ALTER COLUMN x TYPE bigint;\n"
        "CREATE TABLE empty_table (x int);\n"
        "--! vacuum after: first_table\n"
        "--! vacuum after: empty_table\n"
        "--! vacuum after: no_such_table\n")
    (every / "003_third.sql").write_text("CREATE TABLE third_table (x int);")
    all_visible = "SELECT relpages, relallvisible FROM pg_class WHERE relname = 'first_table'"
    with psycopg.connect(empty_database_url, autocommit=autocommit) as conn:
        assert migrations.migrate(conn, first) == ["001_first.sql"]
        caplog.set_level(logging.INFO, logger="harvester.store.migrations")
        assert migrations.migrate(conn, every) == ["002_second.sql", "003_third.sql"]
        pages, visible = conn.execute(all_visible).fetchone()
        conn.rollback()
        assert pages > 1 and visible == pages, (pages, visible)
        assert conn.execute("SELECT reltuples FROM pg_class WHERE relname = 'empty_table'").fetchone()[0] == -1
        conn.rollback()
        assert conn.autocommit is autocommit
    assert "after migration 002_second.sql: first_table vacuumed in" in caplog.text
    assert "empty_table" not in caplog.text
    assert ("after migration 002_second.sql: VACUUM no_such_table failed (UndefinedTable: relation \"no_such_table\""
            " does not exist)") in caplog.text


def test_pending_names_what_an_empty_or_old_database_lacks(empty_database_url, tmp_path):
    (tmp_path / "001_first.sql").write_text("CREATE TABLE first_table (x int);")
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        assert migrations.pending(conn, tmp_path) == ["001_first.sql"]
        migrations.migrate(conn, tmp_path)
        (tmp_path / "002_second.sql").write_text("CREATE TABLE second_table (x int);")
        assert migrations.pending(conn, tmp_path) == ["002_second.sql"]


# -- through Airflow ----------------------------------------------------------------------------

def test_a_migration_waits_a_bounded_time_for_its_locks_and_tries_again(empty_database_url, tmp_path, monkeypatch,
                                                                        caplog):
    """An ALTER TABLE behind a long transaction: it gives up after LOCK_TIMEOUT (so the sessions
    queued behind it are not held up), and tries again; meanwhile nobody waits for it for long."""
    import threading
    import time

    monkeypatch.setattr(migrations, "LOCK_TIMEOUT", "200ms")
    (tmp_path / "001_first.sql").write_text("CREATE TABLE first_table (x int);")
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        migrations.migrate(conn, tmp_path)
        (tmp_path / "002_second.sql").write_text("ALTER TABLE first_table ADD COLUMN y int;")
        holder = psycopg.connect(empty_database_url)
        holder.execute("SELECT count(*) FROM first_table").fetchone()  # holds ACCESS SHARE until it ends
        release = threading.Timer(1.0, holder.rollback)
        release.start()
        caplog.set_level(logging.WARNING, logger="harvester.store.migrations")
        started = time.monotonic()
        assert migrations.migrate(conn, tmp_path) == ["002_second.sql"]
        release.join()
        holder.close()
        assert time.monotonic() - started < 30
        assert "migration 002_second.sql waited more than 200ms for a lock (attempt 1 of" in caplog.text


def test_the_first_task_of_a_run_migrates_an_empty_database_once(harvest, portal_server, samples, empty_database_url,
                                                                  monkeypatch, caplog):
    portal_server.set_records(samples("data-birmingham-gov-uk.jsonl")[:5])
    harvest.configure(portal_server.base_url)
    monkeypatch.setenv("AIRFLOW_CONN_HARVESTER_DB", empty_database_url)
    caplog.set_level(logging.INFO, logger="harvester.store.migrations")

    assert harvest.run(full_sync=True).state == "success"
    names = [path.name for _, path in migrations.migration_files()]
    with psycopg.connect(empty_database_url) as conn:
        assert applied(conn) == names
        assert conn.execute("SELECT count(*) FROM datasets").fetchone()[0] == 5
    said = [r.getMessage() for r in caplog.records if r.name == "harvester.store.migrations"]
    # begin migrated (every migration applied once); the tasks after it found the schema current.
    assert [m for m in said if m.startswith("schema migrations: applied")] == [
        "schema migrations: applied " + ", ".join(names)]
    assert [m for m in said if m.startswith("applying migration")] == [f"applying migration {n}" for n in names]

    caplog.clear()
    caplog.set_level(logging.DEBUG, logger="harvester.store.migrations")
    assert harvest.run().state == "success"
    said = {(r.levelname, r.getMessage()) for r in caplog.records if r.name == "harvester.store.migrations"}
    # every task finds the schema current: said at DEBUG only, not in each task's log (issue 38, finding 7)
    assert said == {("DEBUG", f"schema migrations: up to date ({len(names)} applied)")}


def test_a_task_after_begin_applies_what_a_deploy_added(harvest, portal_server, empty_database_url, monkeypatch,
                                                       caplog):
    """begin marked successful without running (as if it ran before the deploy): fetch_modified is
    the first task to open a connection, and it migrates rather than failing the run."""
    harvest.configure(portal_server.base_url)
    monkeypatch.setenv("AIRFLOW_CONN_HARVESTER_DB", empty_database_url)
    caplog.set_level(logging.INFO, logger="harvester.store.migrations")
    harvest.dag().test(logical_date=datetime.now(timezone.utc), mark_success_pattern="^begin$")
    names = [path.name for _, path in migrations.migration_files()]
    with psycopg.connect(empty_database_url) as conn:
        assert applied(conn) == names
    assert "lacks migrations" not in caplog.text


# -- the server check before migrating ----------------------------------------------------------

def facts(version_num=170004, available="0.8.0", installed="0.8.0"):
    major, minor = divmod(version_num, 10000)
    return migrations.ServerFacts(version_num, f"{major}.{minor}", available, installed, "harvester", "app")


@pytest.mark.parametrize("case, expected", [
    (facts(150000), None),
    (facts(180003, installed="0.8.2"), None),
    (facts(170004, installed=None), None),  # available: check_server creates it
    (facts(190000), None),  # newer than tested: logged, not refused
    (facts(140011), "PostgreSQL 14.11 is too old: Harvester supports PostgreSQL 15 to 18 with pgvector 0.8.0 or newer"),
    (facts(installed="0.7.4"), 'pgvector 0.7.4 is installed in database "harvester" and Harvester needs 0.8.0 or newer:'
                               " run ALTER EXTENSION vector UPDATE; in it as its owner or a superuser (the server has 0.8.0)"),
    (facts(available="0.7.4", installed="0.7.4"), "install pgvector 0.8.0 or newer on the server, then run ALTER"),
    (facts(available=None, installed=None), "the vector extension (pgvector) is not available on PostgreSQL 17.4"),
    (facts(available="0.7.0", installed=None), "the server offers pgvector 0.7.0 and Harvester needs 0.8.0 or newer"),
])
def test_what_the_server_check_refuses_and_says(case, expected):
    reason = migrations.unsupported(case)
    if expected is None:
        assert reason is None
    else:
        assert reason is not None and expected in reason and "\n" not in reason
        assert reason.endswith(("(" + migrations.SUPPORTED + ")", migrations.SUPPORTED))


def test_the_check_reads_the_server_it_is_given(empty_database_url):
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        read = migrations.server_facts(conn)
        assert read.version == conn.execute("SHOW server_version").fetchone()[0]
        assert read.major in migrations.SUPPORTED_MAJORS
        assert read.vector_available == conn.execute(
            "SELECT default_version FROM pg_available_extensions WHERE name = 'vector'").fetchone()[0]
        assert read.vector_installed is None  # an empty database: migrate creates it
        migrations.migrate(conn)
        assert migrations.server_facts(conn).vector_installed == read.vector_available


def test_a_role_that_may_not_create_the_extension_is_told_who_must_before_anything_is_touched(
        empty_database_url, capsys, monkeypatch):
    """A managed database where the application's role is no superuser and nobody ran CREATE
    EXTENSION vector: one line naming the extension, the database, the role and the remedy, from
    `harvester db migrate` and from a task's migration step alike; the database is left as it was."""
    from urllib.parse import urlsplit, urlunsplit

    from harvester.cli.main import main

    role = "app_" + urlsplit(empty_database_url).path.strip("/")
    with psycopg.connect(empty_database_url, autocommit=True) as admin:
        admin.execute(f'CREATE ROLE "{role}" LOGIN')
        admin.execute(f'GRANT ALL ON DATABASE "{urlsplit(empty_database_url).path.strip("/")}" TO "{role}"')
        admin.execute(f'GRANT ALL ON SCHEMA public TO "{role}"')
    parts = urlsplit(empty_database_url)
    url = urlunsplit(parts._replace(netloc=f"{role}@{parts.hostname}:{parts.port}"))
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            with pytest.raises(migrations.UnsupportedServer) as refused:
                migrations.migrate(conn)
        message = str(refused.value)
        assert "\n" not in message and not refused.value.transient
        assert message.startswith('the vector extension (pgvector ') and (
            f'is not installed in database "{parts.path.strip("/")}" and role "{role}" may not create it') in message
        assert message.endswith("have a superuser (on a managed service, its admin role) run CREATE EXTENSION vector;"
                                " in that database")
        monkeypatch.setenv("HARVESTER_DATABASE_URL", url)
        assert main(["db", "migrate"]) != 0
        assert message in capsys.readouterr().err
        with psycopg.connect(empty_database_url, autocommit=True) as admin:
            assert tables(admin) == set()  # not even schema_migrations
            assert admin.execute("SELECT count(*) FROM pg_extension WHERE extname = 'vector'").fetchone()[0] == 0
            admin.execute("CREATE EXTENSION vector")  # what the message asks for: then the role migrates
        with psycopg.connect(url, autocommit=True) as conn:
            assert migrations.migrate(conn)[-1] == migrations.migration_files()[-1][1].name
    finally:
        with psycopg.connect(empty_database_url, autocommit=True) as admin:
            admin.execute(f'REASSIGN OWNED BY "{role}" TO CURRENT_USER')
            admin.execute(f'DROP OWNED BY "{role}"')
        with psycopg.connect(empty_database_url.rsplit("/", 1)[0] + "/postgres", autocommit=True) as admin:
            admin.execute(f'DROP ROLE IF EXISTS "{role}"')


def test_027_lets_autovacuum_reclaim_a_runs_dead_rows_sooner_on_an_existing_database(empty_database_url,
                                                                                     migrate_before):
    """027 (issue 40): the tables holding a row a dataset are vacuumed at 2% dead rows, not 20%, so
    the room a run's changes free is reused by the next runs; an upgrade keeps every row."""
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        migrate_before(conn, 27)
        conn.execute("INSERT INTO datasets (portal_url, source_id, url, url_hash, content_hash, metadata_hash, title,"
                     " first_seen_at, updated_at, last_seen_at, raw) VALUES ('https://p.example', 'a', 'u', 'h', 'cc',"
                     " 'm', 't', now(), now(), now(), '{\"notes\": \"kept\"}')")
        assert migrations.migrate(conn)[0].startswith("027_")
        options = dict(conn.execute(
            "SELECT c.relname, array_to_string(c.reloptions, ',') FROM pg_class c"
            " WHERE c.relname IN ('datasets', 'dataset_search', 'dataset_versions', 'dataset_keys', 'dataset_vectors')"
        ).fetchall())
        assert all("autovacuum_vacuum_scale_factor=0.02" in options[t] for t in options), options
        assert "fillfactor=100" in options["datasets"]  # (009's 70, until 044 kept the runs' sightings apart)
        toast = dict(conn.execute(
            "SELECT c.relname, array_to_string(t.reloptions, ',') FROM pg_class c JOIN pg_class t ON t.oid = c.reltoastrelid"
            " WHERE c.relname IN ('datasets', 'dataset_search', 'dataset_versions')").fetchall())
        assert all(v == "autovacuum_vacuum_scale_factor=0.02" for v in toast.values()), toast
        assert conn.execute("SELECT raw ->> 'notes' FROM datasets").fetchone()[0] == "kept"


def test_033_holds_a_current_versions_last_seen_once_and_every_version_reads_as_before(empty_database_url,
                                                                                       migrate_before):
    """033 (issue 40): a current version whose last_seen_at equals its dataset's holds none (it reads
    the dataset's), one that differs keeps its own, a replaced version keeps its own (a CHECK keeps
    it set); every version, and the view, read what they read before. A run staged before 033 and
    committed after it gets the last_seen_at its replaced versions take; dataset_versions is no
    longer kept with room for updates (fillfactor 100)."""
    t = [datetime(2026, 1, day, tzinfo=timezone.utc) for day in range(1, 6)]
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        migrate_before(conn, 33)
        conn.execute("INSERT INTO datasets (portal_url, source_id, url, url_hash, content_hash, metadata_hash, title,"
                     " first_seen_at, updated_at, last_seen_at, raw) VALUES"
                     " ('https://p.example', 'a', 'ua', 'ha', 'cc', 'm', 't', %(t0)s, %(t0)s, %(t2)s, '{}'),"
                     " ('https://p.example', 'b', 'ub', 'hb', 'cc', 'm', 't', %(t0)s, %(t0)s, %(t2)s, '{}')",
                     {"t0": t[0], "t2": t[2]})
        # a: version 1 replaced (seen until t1), version 2 current (seen at t2, as its dataset);
        # b: its current version seen later than its dataset says (t3: the old writer kept the later)
        conn.execute("INSERT INTO dataset_versions (dataset_id, version_number, content_hash, metadata_hash, snapshot,"
                     " is_current, change_type, first_seen_at, last_seen_at)"
                     " SELECT d.id, v.n, 'cc', 'm', '{}', v.cur, 'new', v.first, v.last FROM datasets d"
                     " JOIN (VALUES ('a', 1, false, %(t0)s::timestamptz, %(t1)s::timestamptz), ('a', 2, true, %(t2)s, %(t2)s),"
                     "              ('b', 1, true, %(t0)s, %(t3)s)) v(source_id, n, cur, first, last)"
                     " ON v.source_id = d.source_id", {"t0": t[0], "t1": t[1], "t2": t[2], "t3": t[3]})
        # a run in flight: staged (by the code before) a new version of a, to be committed after 033
        run_id = conn.execute("INSERT INTO sync_runs (portal_url, portal_name, mode, status) VALUES"
                              " ('https://p.example', 'p', 'full', 'running') RETURNING run_id").fetchone()[0]
        conn.execute("INSERT INTO staging_records (run_id, seq, source_id, outcome) VALUES (%s, 1, 'a', 'updated')",
                     (run_id,))
        conn.execute("INSERT INTO staging_changes (run_id, source_id, change_type, significance, requires_review,"
                     " new_version, record_change) VALUES (%s, 'a', 'title_changed', 0.3, false, true, true)", (run_id,))
        read = ("SELECT d.source_id, v.version_number, coalesce(v.last_seen_at, d.last_seen_at)"
                " FROM dataset_versions v JOIN datasets d ON d.id = v.dataset_id ORDER BY 1, 2")
        before = conn.execute(read).fetchall()
        assert before == [("a", 1, t[1]), ("a", 2, t[2]), ("b", 1, t[3])]
        view = conn.execute("SELECT source_id, version_last_seen_at FROM current_datasets ORDER BY 1").fetchall()

        # (up to 034: 044 then keeps the dataset's last sighting apart, its own test below)
        assert migrate_before(conn, 35)[:2] == ["033_current_last_seen_once.sql", "034_current_last_seen_readers.sql"]
        assert conn.execute(read).fetchall() == before
        assert conn.execute("SELECT source_id, version_last_seen_at FROM current_datasets ORDER BY 1"
                            ).fetchall() == view == [("a", t[2]), ("b", t[3])]
        assert conn.execute("SELECT d.source_id, v.version_number, v.last_seen_at FROM dataset_versions v"
                            " JOIN datasets d ON d.id = v.dataset_id ORDER BY 1, 2").fetchall() == [
            ("a", 1, t[1]), ("a", 2, None), ("b", 1, t[3])]
        assert conn.execute("SELECT old_last_seen_at FROM staging_changes").fetchone()[0] == t[2]
        options = conn.execute("SELECT array_to_string(reloptions, ',') FROM pg_class"
                               " WHERE relname = 'dataset_versions'").fetchone()[0]
        assert "fillfactor=100" in options and "autovacuum_vacuum_scale_factor=0.02" in options
        with pytest.raises(psycopg.errors.CheckViolation, match="dataset_versions_last_seen_kept"):
            conn.execute("UPDATE dataset_versions SET is_current = false WHERE last_seen_at IS NULL")


def test_038_keeps_a_datasets_description_out_of_its_row_and_every_value_as_it_was(empty_database_url,
                                                                                    migrate_before):
    """038 (issue 40): a row written after it keeps its description and raw record out of the row
    (the heap holds the short columns, not a description of 1,500 characters); rows written before
    read as they did, and a run's last_seen_at on them keeps every value; a stranger's huge title,
    tags and source id are still stored whole (out of the row only as a last resort)."""
    description = "(SELECT string_agg(md5(%(tag)s || i || '.' || j), '') FROM generate_series(1, 47) j)"  # 1,504 hex
    insert = ("INSERT INTO datasets (portal_url, source_id, url, url_hash, content_hash, metadata_hash, title,"
              " description, tags, first_seen_at, updated_at, last_seen_at, raw)"
              " SELECT 'https://p.example', %(tag)s || i, 'https://p.example/d/' || i, md5(%(tag)s || i) || md5('u'),"
              " md5(%(tag)s || i) || md5('c'), md5(%(tag)s || i) || md5('m'), 'Title ' || i, " + description + ","
              " jsonb_build_array('t' || i), now(), now(), now(), jsonb_build_object('id', %(tag)s || i,"
              " 'notes', " + description + ") FROM generate_series(1, 300) i")
    values = ("SELECT source_id, md5(description), md5(raw::text), title, tags, url_hash, content_hash FROM datasets"
              " WHERE source_id LIKE %s ORDER BY source_id")
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        migrate_before(conn, 38)
        heap = lambda: conn.execute("SELECT pg_relation_size('datasets')").fetchone()[0]  # noqa: E731
        conn.execute(insert, {"tag": "old-"})
        old_heap = heap()
        old_values = conn.execute(values, ("old-%",)).fetchall()
        assert old_heap > 300 * 1504  # before 038 a row of about 1.7 KB kept its description in line

        # (up to 043: 044 then keeps the dataset's last sighting apart, its own test below)
        assert migrate_before(conn, 44)[0] == "038_dataset_text_out_of_line.sql"
        assert conn.execute(values, ("old-%",)).fetchall() == old_values  # nothing rewritten, nothing changed
        conn.execute(insert, {"tag": "new-"})
        new_heap = heap() - old_heap
        assert 0 < new_heap * 4 < old_heap, (old_heap, new_heap)
        new_values = conn.execute(values, ("new-%",)).fetchall()
        assert len(new_values) == 300 and all(len(r[5]) == 64 for r in new_values)

        # A run that sees the old rows sets their last_seen_at (their new versions take 038's layout).
        conn.execute("UPDATE datasets SET last_seen_at = now() WHERE source_id LIKE 'old-%'")
        conn.execute("VACUUM datasets")
        assert conn.execute(values, ("old-%",)).fetchall() == old_values

        # A stranger's 200 KB title that does not compress, 5,000 tags and a 3 KB source id: stored whole.
        conn.execute(
            "INSERT INTO datasets (portal_url, source_id, url, url_hash, content_hash, metadata_hash, title,"
            " tags, first_seen_at, updated_at, last_seen_at, raw)"
            " SELECT 'https://p.example', repeat('s', 3000), 'https://p.example/huge', md5('h') || md5('u'),"
            " md5('h') || md5('c'), md5('h') || md5('m'),"
            " (SELECT string_agg(md5(j::text), '') FROM generate_series(1, 6400) j),"
            " (SELECT jsonb_agg(md5(j::text)) FROM generate_series(1, 5000) j), now(), now(), now(), '{}'")
        assert conn.execute(
            "SELECT length(title), md5(title) = md5((SELECT string_agg(md5(j::text), '') FROM generate_series(1, 6400) j)),"
            " jsonb_array_length(tags), length(source_id) FROM datasets WHERE url = 'https://p.example/huge'"
        ).fetchone() == (204800, True, 5000, 3000)


def test_039_drops_the_url_hash_index_no_statement_used_and_a_url_is_still_found(empty_database_url,
                                                                                 migrate_before):
    """039 (issue 40): datasets_url_hash is gone; `harvester history --url` (find_dataset) finds a
    dataset by its landing page, written differently, and by a fragment URL of a catalogue entry,
    as before; the plan it runs on is the one it had with the index (the index was never chosen)."""
    from harvester.domain.dataset import normalize_url, sha256_hex
    from harvester.store import history

    rows = ("INSERT INTO datasets (portal_url, source_id, url, url_hash, content_hash, metadata_hash, title,"
            " first_seen_at, updated_at, last_seen_at, raw) VALUES"
            " ('https://p.example', 'a', 'https://p.example/dataset/a', %(ha)s, 'cc', 'm', 't',"
            "  now(), now(), now(), '{}'),"
            " ('https://p.example', 'b', 'https://p.example/data.json#b', %(hb)s, 'cc', 'm', 't',"
            "  now(), now(), now(), '{}')")
    hashes = {"ha": sha256_hex(normalize_url("https://p.example/dataset/a")),
              "hb": sha256_hex(f"{normalize_url('https://p.example/data.json')}#b")}
    plan = ("EXPLAIN (COSTS OFF) SELECT id FROM datasets d WHERE d.portal_url = 'https://p.example'"
            " AND (d.url_hash = 'x' OR d.url = 'y')")
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        migrate_before(conn, 39)
        conn.execute(rows, hashes)
        conn.execute("ANALYZE datasets")
        before = [r[0] for r in conn.execute(plan)]
        assert conn.execute("SELECT to_regclass('datasets_url_hash')").fetchone()[0] is not None
        assert "datasets_url_hash" not in "\n".join(before), before

        assert migrations.migrate(conn)[0] == "039_drop_unused_url_hash_index.sql"
        assert conn.execute("SELECT to_regclass('datasets_url_hash')").fetchone()[0] is None
        assert [r[0] for r in conn.execute(plan)] == before
        for url, source in (("HTTPS://P.EXAMPLE/dataset/a/", "a"), ("https://p.example/data.json#b", "b")):
            assert history.find_dataset(conn, "https://p.example", url=url)["source_id"] == source
        assert history.find_dataset(conn, "https://p.example", url="https://p.example/dataset/c") is None


def test_040_looks_datasets_up_by_content_hash_through_a_hash_index_that_finds_the_same_rows(
        empty_database_url, migrate_before):
    """040 (issue 40): datasets.content_hash is indexed by hash, under its old name. Every kind of
    lookup of datasets by a content hash the code makes (equality, = ANY, a join, an anti-join) goes
    through the new index and finds the rows it found through the B-tree, texts shared by several
    datasets included. dataset_search.content_hash, which search's vector side probes, keeps its
    B-tree."""
    insert = ("INSERT INTO datasets (portal_url, source_id, url, url_hash, content_hash, metadata_hash, title,"
              " first_seen_at, updated_at, last_seen_at, raw)"
              " SELECT 'https://p.example', 's' || i, 'https://p.example/' || i, md5(i::text) || md5('u'),"
              " md5((i % 700)::text) || md5('c'), md5(i::text) || md5('m'), 'title ' || i, now(), now(), now(), '{}'"
              " FROM generate_series(1, 2000) i")
    def md5(text):
        return hashlib.md5(text.encode()).hexdigest()

    values = (1, 2, 699, 5000)  # shared by 3, 3, 2 and no dataset
    h = [md5(str(v)) + md5("c") for v in values]
    lookups = [
        ("SELECT id FROM datasets WHERE content_hash = %s ORDER BY id", (h[0],), "datasets_content_hash"),
        ("SELECT id FROM datasets WHERE content_hash = ANY(%s) ORDER BY id", (h,), "datasets_content_hash"),
        ("SELECT d.id FROM unnest(%s::text[]) f(h) JOIN datasets d ON d.content_hash = f.h"
         " ORDER BY 1", (h,), "datasets_content_hash"),
        ("SELECT f.h FROM unnest(%s::text[]) f(h) WHERE NOT EXISTS (SELECT 1 FROM datasets d"
         " WHERE d.content_hash = f.h) ORDER BY 1", (h,), "datasets_content_hash"),
    ]

    def found(conn):
        return [conn.execute(query, params).fetchall() for query, params, _ in lookups]

    def through_index(conn):
        """Whether each lookup's plan reads its index once other plans are ruled out."""
        with conn.transaction():
            for setting in ("enable_seqscan", "enable_hashjoin", "enable_mergejoin"):
                conn.execute(f"SET LOCAL {setting} = off")
            return [index in "\n".join(r[0] for r in conn.execute("EXPLAIN (COSTS OFF) " + query, params))
                    for query, params, index in lookups]

    def kinds(conn):
        return conn.execute(
            "SELECT c.relname, am.amname FROM pg_class c JOIN pg_am am ON am.oid = c.relam"
            " WHERE c.relname IN ('datasets_content_hash', 'dataset_search_content_hash') ORDER BY 1").fetchall()

    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        migrate_before(conn, 40)
        conn.execute(insert)
        conn.execute("ANALYZE datasets, dataset_search")
        assert kinds(conn) == [("dataset_search_content_hash", "btree"), ("datasets_content_hash", "btree")]
        before = found(conn)
        assert [len(rows) for rows in before] == [3, 8, 8, 1], before
        assert through_index(conn) == [True] * len(lookups)

        assert migrations.migrate(conn)[0] == "040_content_hash_lookups_by_hash_index.sql"
        assert kinds(conn) == [("dataset_search_content_hash", "btree"), ("datasets_content_hash", "hash")]
        assert through_index(conn) == [True] * len(lookups)
        assert found(conn) == before
        # written afterwards: found through the new index too
        conn.execute("UPDATE datasets SET content_hash = %s WHERE source_id = 's5'", (h[3],))
        assert conn.execute(lookups[0][0], (h[3],)).fetchall() == conn.execute(
            "SELECT id FROM datasets WHERE source_id = 's5'").fetchall()
        assert conn.execute("SELECT count(*) FROM dataset_search WHERE content_hash = decode(%s, 'hex')",
                            (h[3],)).fetchone()[0] == 1


def insert_datasets(conn, portals: list[str], n: int) -> None:
    """``n`` datasets s1 to sn of ``portals`` in turn, each text's hash a SHA-256 in hexadecimal."""
    conn.execute(
        "INSERT INTO datasets (portal_url, source_id, url, url_hash, content_hash, metadata_hash, title,"
        " first_seen_at, updated_at, last_seen_at, raw)"
        " SELECT (%s::text[])[1 + i %% %s], 's' || i, 'https://p.example/' || i, md5(i::text) || md5('u'),"
        " encode(sha256(('c' || i)::bytea), 'hex'), md5(i::text) || md5('m'), 'title ' || i, now(), now(), now(),"
        " '{}' FROM generate_series(1, %s) i", (portals, len(portals), n))


def test_041_packs_search_copies_five_to_a_page_and_keeps_every_copy(empty_database_url, migrate_before):
    """041 (issue 40): dataset_vectors is written anew with each copy's portal and model as a scope
    (vector_scopes) and its text's hash as bytes: at 768 dimensions five rows a page, whatever the
    length of the portal's URL and the model's name. Every copy is carried with its vector, portal,
    model and hash; a hand-made copy whose hash is no hexadecimal is left behind and its portal's
    checked mark with it; the per-portal indexes of the old table are gone from portal_indexes too.
    The table keeps its options, its key, its cascade and the trigger of deleted vectors, and the
    runs' writer finds what is missing."""
    import numpy as np

    from harvester.store import portal_indexes, vectors

    portals = ["https://open.data.example.gov/catalogue/a/rather/long/path/of/a/portal", "https://p.example"]
    models = ["a-model-with-a-rather-long-name-of-sixty-characters-or-thereabouts@768", "m@768"]
    n = 61
    rng = np.random.default_rng(41)
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        migrate_before(conn, 41)
        insert_datasets(conn, portals, n)
        hashes = [r[0] for r in conn.execute("SELECT content_hash FROM datasets ORDER BY id")]
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO embeddings (content_hash, model, dimension, embedding) VALUES (%s, %s, 768,"
                            " %s::halfvec)", [(h, m, str(rng.standard_normal(768).round(3).tolist()))
                                              for h in hashes for m in models])
        # each portal's copies of its model (the first portal's of the long name)
        conn.execute("INSERT INTO dataset_vectors (dataset_id, model, content_hash, embedding, portal_url)"
                     " SELECT d.id, e.model, e.content_hash, e.embedding, d.portal_url FROM datasets d"
                     " JOIN embeddings e ON e.content_hash = d.content_hash"
                     " AND e.model = (%s::text[])[array_position(%s::text[], d.portal_url)] ORDER BY d.id",
                     (models, portals))
        hand_made = conn.execute("UPDATE dataset_vectors SET content_hash = 'not a hash' WHERE dataset_id ="
                                 " (SELECT max(dataset_id) FROM dataset_vectors WHERE portal_url = %s)"
                                 " RETURNING dataset_id", (portals[1],)).fetchone()[0]
        for portal, model in zip(portals, models):
            conn.execute("INSERT INTO dataset_vectors_checked (portal_url, model) VALUES (%s, %s)", (portal, model))
        conn.execute("CREATE INDEX dataset_vectors_p_old ON dataset_vectors USING hnsw"
                     " ((embedding::halfvec(768)) halfvec_cosine_ops) WHERE portal_url = %s" % psycopg.sql.Literal(
                         portals[0]).as_string(conn))
        conn.execute("INSERT INTO portal_indexes (portal_url, model, index_name, dimension, datasets, build_seconds,"
                     " bytes) VALUES (%s, %s, 'dataset_vectors_p_old', 768, 31, 0.1, 1)", (portals[0], models[0]))
        before = {r[0]: r[1:] for r in conn.execute(
            "SELECT dataset_id, portal_url, model, content_hash, embedding::text FROM dataset_vectors"
            " WHERE dataset_id <> %s", (hand_made,))}
        assert len(before) == n - 1 and len(set(before[i][3] for i in before)) == n - 1

        assert migrations.migrate(conn)[0] == "041_dataset_vectors_five_a_page.sql"
        after = {r[0]: r[1:] for r in conn.execute(
            "SELECT v.dataset_id, k.portal_url, k.model, encode(v.content_hash, 'hex'), v.embedding::text"
            " FROM dataset_vectors v JOIN vector_scopes k ON k.id = v.scope")}
        assert after == before
        assert conn.execute("SELECT portal_url FROM dataset_vectors_checked").fetchall() == [(portals[0],)]
        # the portal's index went with the old table: listed as missing, not searched, until built again
        assert conn.execute("SELECT count(*) FROM pg_class WHERE relname = 'dataset_vectors_p_old'").fetchone()[0] == 0
        assert [(r["index_name"], r["state"], r["searched"]) for r in portal_indexes.listing(conn)] == [
            ("dataset_vectors_p_old", "missing", False)]
        assert portal_indexes.usable(conn, portals[0], models[0]) is None
        per_page = [r[0] for r in conn.execute("SELECT count(*) FROM dataset_vectors"
                                               " GROUP BY (ctid::text::point)[0] ORDER BY 1 DESC")]
        assert per_page[0] == 5 and len(per_page) == -(-(n - 1) // 5), per_page
        assert conn.execute("SELECT max(pg_column_size(v.*)) FROM dataset_vectors v").fetchone()[0] <= 1624
        options = conn.execute("SELECT reloptions FROM pg_class WHERE relname = 'dataset_vectors'").fetchone()[0]
        assert sorted(options) == ["autovacuum_vacuum_scale_factor=0.02", "toast_tuple_target=8160"]
        assert conn.execute("SELECT corr(dataset_id, (ctid::text::point)[0]) FROM dataset_vectors").fetchone()[0] > 0.99

        # the writer copies what was left behind, and marks the portal checked again
        assert vectors.copy_for_search(conn, portals[1], models[1]) == 1
        assert vectors.copies_checked(conn, portals[1], models[1])
        assert vectors.copy_for_search(conn, portals[1], models[1]) == 0
        # the portal's next maintenance builds its index again, over its scope
        settings = portal_indexes.PortalIndexSettings(min_datasets=10, max_share=0.9)
        done = portal_indexes.maintain(conn, portals[0], models[0], settings=settings)
        name = portal_indexes.index_name(portals[0], models[0])
        assert done["action"] == "built" and done["dropped"] == [] and done["datasets"] == 30, done
        assert [(r["index_name"], r["state"], r["searched"]) for r in portal_indexes.listing(conn)] == [
            (name, "valid", True)]
        scope = vectors.existing_scope(conn, portals[0], models[0])
        assert portal_indexes.usable(conn, portals[0], models[0]) == scope
        assert conn.execute("SELECT pg_get_expr(i.indpred, i.indrelid) FROM pg_index i"
                            " WHERE i.indexrelid = %s::regclass", (name,)).fetchone()[0] == f"(scope = {scope})"
        # a vector deleted from embeddings takes its copy with it; a dataset deleted, its copy
        first, second = sorted(d for d in after if after[d][0] == portals[0])[:2]
        conn.execute("DELETE FROM embeddings WHERE content_hash = decode(%s, 'hex')"
                     " AND model = (SELECT id FROM embedding_models WHERE name = %s)", (after[first][2], models[0]))
        conn.execute("DELETE FROM datasets WHERE id = %s", (second,))
        assert conn.execute("SELECT count(*) FROM dataset_vectors WHERE dataset_id IN (%s, %s)",
                            (first, second)).fetchone()[0] == 0
        assert not vectors.copies_checked(conn, portals[0], models[0])
        assert conn.execute("SELECT count(*) FROM dataset_vectors").fetchone()[0] == n - 2


def test_042_packs_the_vectors_five_to_a_page_and_keeps_every_vector(empty_database_url, migrate_before):
    """042 (issue 40): embeddings is written anew with each vector's model as an id
    (embedding_models) and its text's hash as bytes: at 768 dimensions five rows a page, whatever the
    length of the model's name. Every vector is carried with its hash, model, dimension, creation
    time and run; a hand-made vector whose hash is not lowercase hexadecimal (no dataset's text has
    it) is left behind. The models' indexes go with the old table: missing until the next
    upsert (or `harvester embeddings reindex`) builds them over the model's id. The key, the checks and
    the trigger of deleted vectors hold on the new table, and runs' statements find what they did."""
    import numpy as np
    from pgvector.psycopg import register_vector

    from harvester.store import claims, vectors

    models = ["a-model-with-a-rather-long-name-of-sixty-characters-or-thereabouts@768", "m@768"]
    n = 31
    rng = np.random.default_rng(42)
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        migrate_before(conn, 42)
        insert_datasets(conn, ["https://p.example"], n)
        hashes = [r[0] for r in conn.execute("SELECT content_hash FROM datasets ORDER BY id")]
        conn.execute("INSERT INTO sync_runs (portal_url, portal_name, status, mode) VALUES ('https://p.example', 'p',"
                     " 'committed', 'full')")
        run = conn.execute("SELECT max(run_id) FROM sync_runs").fetchone()[0]
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO embeddings (content_hash, model, dimension, embedding, created_at, run_id)"
                            " VALUES (%s, %s, 768, %s::halfvec, now() - make_interval(days => %s), %s)",
                            [(h, m, str(rng.standard_normal(768).round(3).tolist()), i, run if i % 2 else None)
                             for i, h in enumerate(hashes) for m in models])
        # hand-made vectors: no run writes such a hash, and no dataset's text has it
        conn.execute("UPDATE embeddings SET content_hash = 'not a hash' WHERE content_hash = %s AND model = %s",
                     (hashes[0], models[1]))
        conn.execute("UPDATE embeddings SET content_hash = upper(content_hash) WHERE content_hash = %s AND model = %s",
                     (hashes[1], models[1]))
        conn.execute("UPDATE datasets SET embedded_content_hash = content_hash WHERE source_id NOT IN ('s1', 's2')")
        conn.execute("CREATE INDEX embeddings_hnsw_old ON embeddings USING hnsw ((embedding::halfvec(768))"
                     " halfvec_cosine_ops) WHERE model = 'm@768'")
        before = {tuple(r[:2]): r[2:] for r in conn.execute(
            "SELECT content_hash, model, dimension, embedding::text, created_at, run_id FROM embeddings"
            " WHERE content_hash ~ '^[0-9a-f]+$'")}
        assert len(before) == 2 * n - 2

        assert migrations.migrate(conn)[0] == "042_embeddings_five_a_page.sql"
        after = {tuple(r[:2]): r[2:] for r in conn.execute(
            "SELECT encode(e.content_hash, 'hex'), m.name, e.dimension, e.embedding::text, e.created_at, e.run_id"
            " FROM embeddings e JOIN embedding_models m ON m.id = e.model")}
        assert after == before
        per_page = [r[0] for r in conn.execute("SELECT count(*) FROM embeddings GROUP BY (ctid::text::point)[0]"
                                               " ORDER BY 1 DESC")]
        assert per_page[0] == 5 and len(per_page) == -(-(2 * n - 2) // 5), per_page
        assert conn.execute("SELECT max(pg_column_size(e.*)) FROM embeddings e").fetchone()[0] <= 1624
        # the model's index went with the old table: missing until built again, over the model's id
        assert conn.execute("SELECT count(*) FROM pg_class WHERE relname = 'embeddings_hnsw_old'").fetchone()[0] == 0
        assert vectors.indexed_models(conn) == set()
        assert vectors.index_state(conn, models[1]) == "missing" and vectors.index_missing(conn, models[1]) == 768
        assert vectors.restore_index(conn, models[1]) is True
        assert vectors.indexed_models(conn) == {models[1]}
        number = vectors.model_id(conn, models[1])
        assert conn.execute("SELECT pg_get_expr(i.indpred, i.indrelid) FROM pg_index i WHERE i.indexrelid = %s::regclass",
                            (vectors.index_name(models[1]),)).fetchone()[0] == f"(model = {number})"
        for setting in ("enable_seqscan", "enable_bitmapscan", "enable_sort"):  # 60 rows: the plan at scale
            conn.execute(f"SET {setting} = off")
        register_vector(conn)
        assert f"Index Scan using {vectors.index_name(models[1])}" in vectors.explain_search(
            conn, models[1], 768, rng.standard_normal(768))
        conn.execute("RESET ALL")
        # the key and the checks hold; runs' statements find the carried vectors by their hex hashes
        with pytest.raises(psycopg.errors.UniqueViolation):
            conn.execute("INSERT INTO embeddings (model, dimension, content_hash, embedding)"
                         " SELECT model, dimension, content_hash, embedding FROM embeddings LIMIT 1")
        with pytest.raises(psycopg.errors.CheckViolation):
            conn.execute("INSERT INTO embeddings (model, dimension, content_hash, embedding)"
                         " VALUES (%s, 3, '\\x00', '[1,2]')", (number,))
        assert claims.landed(conn, models[0], hashes[:3]) == set(hashes[:3])
        assert claims.landed(conn, models[1], hashes[:3]) == {hashes[2]}
        assert vectors.coverage(conn) == {models[0]: (n, n), models[1]: (n - 2, n)}
        assert vectors.write(conn, models[1], 768, [hashes[0]], [rng.standard_normal(768)]) == 1
        assert claims.landed(conn, models[1], hashes[:1]) == {hashes[0]}
        assert conn.execute("SELECT count(*) FROM embedding_models").fetchone()[0] == 2  # no new id for a model
        # a vector deleted takes its copies for search with it
        scope = vectors.scope(conn, "https://p.example", models[1])
        conn.execute("INSERT INTO dataset_vectors (dataset_id, scope, embedding, content_hash)"
                     " SELECT d.id, %s, e.embedding, e.content_hash FROM datasets d"
                     " JOIN embeddings e ON e.content_hash = decode(d.content_hash, 'hex') AND e.model = %s",
                     (scope, number))
        conn.execute("INSERT INTO dataset_vectors_checked (portal_url, model) VALUES ('https://p.example', %s)",
                     (models[1],))
        assert conn.execute("SELECT count(*) FROM dataset_vectors").fetchone()[0] == n - 1
        assert vectors.invalidate(conn, models[1], source_id="s3") == 1
        assert conn.execute("SELECT count(*) FROM dataset_vectors").fetchone()[0] == n - 2
        assert not vectors.copies_checked(conn, "https://p.example", models[1])


def test_043_holds_search_rows_hashes_as_bytes_and_every_row_as_it_was(empty_database_url, migrate_before):
    """043 (issue 40): dataset_search.content_hash is the hash's 32 bytes, as the vectors' hashes are
    (041, 042). A dataset whose hash is not hexadecimal (hand-made) stops the migration with an error
    naming it, nothing changed; once it is set right, every search row reads as before (the hash as
    hex), every index of the table is there as it was, new and changed datasets get rows with the
    hash as bytes, and a deleted vector still takes its copies for search with it (the trigger now
    compares bytes)."""
    import numpy as np
    from pgvector.psycopg import register_vector

    from harvester.store import vectors

    portals = ["https://p.example", "https://q.example"]
    n = 40
    columns = ("dataset_id, portal_url, {hash}, removed_at, metadata_modified, config::text, organizations, tags,"
               " formats, licenses, document::text")
    indexes = "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'dataset_search' ORDER BY 1"
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        migrate_before(conn, 43)
        insert_datasets(conn, portals, n)
        conn.execute("UPDATE datasets SET removed_at = now(), organization = 'Org ' || id,"
                     " tags = '[\"Water\", \"x\"]' WHERE id % 7 = 0")
        good = conn.execute("SELECT content_hash FROM datasets WHERE source_id = 's5'").fetchone()[0]
        conn.execute("UPDATE datasets SET content_hash = 'not a hash' WHERE source_id = 's5'")
        bad_id = conn.execute("SELECT id FROM datasets WHERE source_id = 's5'").fetchone()[0]
        before = conn.execute(f"SELECT {columns.format(hash='content_hash')} FROM dataset_search ORDER BY 1").fetchall()
        index_defs = conn.execute(indexes).fetchall()

        with pytest.raises(migrations.MigrationError) as refused:
            migrations.migrate(conn)
        assert f"{bad_id} ('not a hash')" in str(refused.value) and "hexadecimal" in str(refused.value)
        assert conn.execute("SELECT format_type(atttypid, NULL) FROM pg_attribute WHERE attrelid ="
                            " 'dataset_search'::regclass AND attname = 'content_hash'").fetchone()[0] == "text"
        assert conn.execute(f"SELECT {columns.format(hash='content_hash')} FROM dataset_search"
                            " ORDER BY 1").fetchall() == before

        conn.execute("UPDATE datasets SET content_hash = %s WHERE id = %s", (good, bad_id))
        before = conn.execute(f"SELECT {columns.format(hash='content_hash')} FROM dataset_search ORDER BY 1").fetchall()
        assert len(before) == n
        # (043 alone: 044 then keeps the dataset's last sighting apart, its own test below)
        assert migrate_before(conn, 44) == ["043_search_content_hash_bytes.sql"]
        as_hex = columns.format(hash="encode(content_hash, 'hex')")
        assert conn.execute(f"SELECT {as_hex} FROM dataset_search ORDER BY 1").fetchall() == before
        assert conn.execute("SELECT format_type(atttypid, NULL) FROM pg_attribute WHERE attrelid ="
                            " 'dataset_search'::regclass AND attname = 'content_hash'").fetchone()[0] == "bytea"
        assert conn.execute(indexes).fetchall() == index_defs
        assert conn.execute("SELECT max(pg_column_size(content_hash)) FROM dataset_search").fetchone()[0] == 33
        # written anew, and vacuumed once committed: portal filters' index-only scans read no heap
        assert conn.execute("SELECT relallvisible = relpages AND relpages > 0 FROM pg_class"
                            " WHERE relname = 'dataset_search'").fetchone()[0] is True

        # rows written from now on: a new dataset, a dataset whose text changed
        insert_datasets(conn, ["https://r.example"], 3)
        conn.execute("UPDATE datasets SET content_hash = encode(sha256('changed'::bytea), 'hex') WHERE source_id = 's1'"
                     " AND portal_url = 'https://q.example'")
        assert conn.execute(
            "SELECT count(*), count(*) FILTER (WHERE s.content_hash = decode(d.content_hash, 'hex'))"
            " FROM datasets d JOIN dataset_search s ON s.dataset_id = d.id").fetchone() == (n + 3, n + 3)

        # a vector deleted takes the copies of its text with it (harvester_vectors_deleted)
        rng = np.random.default_rng(43)
        register_vector(conn)
        hashes = [r[0] for r in conn.execute("SELECT content_hash FROM datasets WHERE portal_url = 'https://p.example'"
                                             " ORDER BY id")]
        vectors.write(conn, "m@8", 8, hashes, [rng.standard_normal(8) for _ in hashes])
        assert vectors.copy_for_search(conn, "https://p.example", "m@8") == len(hashes)
        conn.execute("DELETE FROM embeddings WHERE content_hash = %s", (bytes.fromhex(hashes[0]),))
        assert conn.execute("SELECT count(*) FROM dataset_vectors").fetchone()[0] == len(hashes) - 1
        assert vectors.copy_for_search(conn, "https://p.example", "m@8") == 0


def test_044_keeps_a_datasets_last_sighting_apart_and_every_reader_gives_what_it_did(empty_database_url,
                                                                                    migrate_before):
    """044 and 045 (issue 40): datasets.last_seen_at is gone; a dataset last seen after its last change gets
    a row in dataset_seen with that time, the others none, and when a run last saw each dataset, live
    or removed, reads as before (greatest(updated_at, dataset_seen's)), in current_datasets too, its
    current versions' included (one holding a later time of its own keeps it). datasets goes to
    fillfactor 100, dataset_seen is at 50, and a deleted dataset takes its row there with it."""
    t = [datetime(2026, 1, day, tzinfo=timezone.utc) for day in range(1, 6)]
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        migrate_before(conn, 44)
        insert_datasets(conn, ["https://p.example", "https://q.example"], 12)
        conn.execute("UPDATE datasets SET first_seen_at = %(t0)s, updated_at = %(t1)s,"
                     " last_seen_at = CASE WHEN id %% 3 = 0 THEN %(t1)s WHEN id %% 3 = 1 THEN %(t2)s ELSE %(t3)s END,"
                     " removed_at = CASE WHEN id %% 4 = 0 THEN %(t3)s END",
                     {"t0": t[0], "t1": t[1], "t2": t[2], "t3": t[3]})
        conn.execute("INSERT INTO dataset_versions (dataset_id, version_number, content_hash, metadata_hash,"
                     " is_current, change_type, first_seen_at, last_seen_at)"
                     " SELECT id, 1, content_hash, metadata_hash, true, 'new', first_seen_at,"
                     " CASE WHEN id = 2 THEN %s::timestamptz END FROM datasets", (t[4],))
        seen = "SELECT id, last_seen_at FROM datasets ORDER BY id"
        before = conn.execute(seen).fetchall()
        view = "SELECT * FROM current_datasets ORDER BY dataset_id"
        view_before = conn.execute(view).fetchall()
        assert len(view_before) == 9 and {r[-1] for r in view_before} == {t[1], t[2], t[3]}

        assert migrate_before(conn, 46) == ["044_last_seen_apart.sql", "045_last_seen_readers.sql"]
        assert conn.execute("SELECT d.id, greatest(d.updated_at, k.last_seen_at) FROM datasets d"
                            " LEFT JOIN dataset_seen k ON k.dataset_id = d.id ORDER BY d.id").fetchall() == before
        assert conn.execute(view).fetchall() == view_before
        assert conn.execute("SELECT dataset_id, last_seen_at FROM dataset_seen ORDER BY 1").fetchall() == [
            (i, s) for i, s in before if s > t[1]]
        assert conn.execute("SELECT version_last_seen_at FROM current_datasets WHERE dataset_id = 2").fetchone()[0] == t[4]
        assert conn.execute("SELECT count(*) FROM information_schema.columns WHERE table_name = 'datasets'"
                            " AND column_name = 'last_seen_at'").fetchone()[0] == 0
        options = dict(conn.execute("SELECT relname, array_to_string(reloptions, ',') FROM pg_class"
                                    " WHERE relname IN ('datasets', 'dataset_seen')").fetchall())
        assert "fillfactor=100" in options["datasets"] and "fillfactor=50" in options["dataset_seen"], options
        conn.execute("DELETE FROM datasets WHERE id = 2")
        assert conn.execute("SELECT count(*) FROM dataset_seen WHERE dataset_id = 2").fetchone()[0] == 0
