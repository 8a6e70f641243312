"""Schema migrations: each in its own transaction, applied by a run's begin task (once per DAG run)
and by `harvester db migrate`, never by the other tasks, which refuse a schema that is behind."""
from __future__ import annotations

import logging
import uuid
from datetime import datetime, timezone

import psycopg
import pytest

from harvester.store import migrations


@pytest.fixture
def empty_url(pg_server):
    """A database with nothing in it (not even schema_migrations)."""
    name = f"m_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg_server.url("postgres"), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield pg_server.url(name)
    with psycopg.connect(pg_server.url("postgres"), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def tables(conn) -> set[str]:
    return {r[0] for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")}


def applied(conn) -> list[str]:
    return [r[0] for r in conn.execute("SELECT name FROM schema_migrations ORDER BY version")]


def test_each_migration_in_its_own_transaction(empty_url, tmp_path):
    (tmp_path / "001_first.sql").write_text("CREATE TABLE first_table (x int);")
    (tmp_path / "002_second.sql").write_text("CREATE TABLE second_table (x int);")
    (tmp_path / "003_third.sql").write_text("CREATE TABLE third_table (x int);\nSELECT 1 / 0;")
    with psycopg.connect(empty_url, autocommit=True) as conn:
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


def test_pending_names_what_an_empty_or_old_database_lacks(empty_url, tmp_path):
    (tmp_path / "001_first.sql").write_text("CREATE TABLE first_table (x int);")
    with psycopg.connect(empty_url, autocommit=True) as conn:
        assert migrations.pending(conn, tmp_path) == ["001_first.sql"]
        migrations.migrate(conn, tmp_path)
        (tmp_path / "002_second.sql").write_text("CREATE TABLE second_table (x int);")
        assert migrations.pending(conn, tmp_path) == ["002_second.sql"]


# -- through Airflow ----------------------------------------------------------------------------

def test_begin_migrates_an_empty_database_once_per_dag_run(harvest, portal_server, samples, empty_url, monkeypatch,
                                                           caplog):
    portal_server.set_records(samples("data-birmingham-gov-uk.jsonl")[:5])
    harvest.configure(portal_server.base_url)
    monkeypatch.setenv("AIRFLOW_CONN_HARVESTER_DB", empty_url)
    caplog.set_level(logging.INFO, logger="harvester.store.migrations")

    assert harvest.run(full_sync=True).state == "success"
    names = [path.name for _, path in migrations.migration_files()]
    with psycopg.connect(empty_url) as conn:
        assert applied(conn) == names
        assert conn.execute("SELECT count(*) FROM datasets").fetchone()[0] == 5
    said = [r.getMessage() for r in caplog.records if r.name == "harvester.store.migrations"]
    # begin migrated (every migration applied once); the five tasks after it did not run migrate.
    assert [m for m in said if m.startswith("schema migrations:")] == ["schema migrations: applied " + ", ".join(names)]
    assert [m for m in said if m.startswith("applying migration")] == [f"applying migration {n}" for n in names]

    caplog.clear()
    assert harvest.run().state == "success"
    said = [r.getMessage() for r in caplog.records if r.name == "harvester.store.migrations"]
    assert said == [f"schema migrations: up to date ({len(names)} applied)"]


def test_a_task_other_than_begin_refuses_a_schema_behind_and_does_not_migrate(harvest, portal_server, empty_url,
                                                                              monkeypatch, capfd, caplog):
    """begin marked successful without running: fetch_modified is the first task to open a connection."""
    harvest.configure(portal_server.base_url)
    monkeypatch.setenv("AIRFLOW_CONN_HARVESTER_DB", empty_url)
    dag_run = harvest.dag().test(logical_date=datetime.now(timezone.utc), mark_success_pattern="^begin$")

    assert dag_run.state == "failed"
    with psycopg.connect(empty_url) as conn:
        assert tables(conn) == set()        # fetch_modified's connection did not migrate
    out = capfd.readouterr()
    said = out.out + out.err + caplog.text
    names = ", ".join(path.name for _, path in migrations.migration_files())
    assert f"lacks migrations {names}: run `harvester db migrate`" in said, said[-3000:]
