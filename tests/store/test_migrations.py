"""Schema migrations: each in its own transaction under a transaction-level advisory lock, applied
by `harvester db migrate` and by whichever task of a run comes first (a deploy while runs are in
flight), waiting a bounded time for their locks."""
from __future__ import annotations

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
    assert harvest.run().state == "success"
    said = {r.getMessage() for r in caplog.records if r.name == "harvester.store.migrations"}
    assert said == {f"schema migrations: up to date ({len(names)} applied)"}


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
