"""Which database a harvest uses, through real Airflow (dag.test()): the connection harvester_db,
the embedded PostgreSQL only when no harvester_db is defined at all (with a WARNING), and a failed
run naming harvester_db and why for anything else. Also the CLI's side of the same rules."""
from __future__ import annotations

import logging

import psycopg
import pytest
from airflow.secrets import BaseSecretsBackend

from harvester.cli.main import main

BIRMINGHAM = "data-birmingham-gov-uk.jsonl"
PASSWORD = "s3cret-Pw"


class UnreachableVault(BaseSecretsBackend):
    """A secrets backend that is down: AIRFLOW__SECRETS__BACKEND=test_db_connection.UnreachableVault."""

    def get_conn_value(self, conn_id: str, team_name: str | None = None) -> str | None:
        if conn_id == "harvester_db":
            raise ConnectionError("vault.example:8200 did not answer")
        return None


def task_states(dag_run) -> dict[str, tuple[str, int]]:
    from airflow.models import TaskInstance
    from airflow.utils.session import create_session

    with create_session() as session:
        return {ti.task_id: (ti.state, ti.try_number)
                for ti in session.query(TaskInstance).filter(TaskInstance.run_id == dag_run.run_id)}


@pytest.fixture
def setup(harvest, portal_server, samples, monkeypatch, tmp_path):
    """A portal to harvest, one retry allowed (to tell retried failures from immediate ones), and an
    embedded-server home that must stay empty unless the test expects the fallback."""
    portal_server.set_records(samples(BIRMINGHAM)[:5])
    harvest.configure(portal_server.base_url)
    monkeypatch.setenv("HARVESTER_TASK_RETRIES", "1")
    monkeypatch.setenv("HARVESTER_TASK_RETRY_DELAY_SECS", "0")
    home = tmp_path / "embedded"
    monkeypatch.setenv("HARVESTER_HOME", str(home))
    monkeypatch.delenv("HARVESTER_EMBEDDED_DB", raising=False)
    return home


def never_started(home) -> bool:
    return not (home / "pgdata").exists() and not (home / "port").exists()


@pytest.mark.parametrize("value, why", [
    (f"postgresql://harvester:{PASSWORD}@127.0.0.1:notaport/harvester",
     "Port could not be cast to integer value as 'notaport'"),
    (f"postgresql://harvester:{PASSWORD}@127.0.0.1:99999/harvester", "Port out of range"),
    ('{"conn_type": "postgres", "host": "127.0.0.1", "password": "' + PASSWORD + '", "port": 5432',
     "JSONDecodeError"),
    (f"postgress://harvester:{PASSWORD}@127.0.0.1:5432/harvester", "not a PostgreSQL connection (type 'postgress'"),
], ids=["bad-port", "port-out-of-range", "broken-json", "unknown-scheme"])
def test_a_malformed_connection_fails_the_run_without_retries_and_never_falls_back(
        setup, harvest, db, capfd, caplog, monkeypatch, value, why):
    monkeypatch.setenv("AIRFLOW_CONN_HARVESTER_DB", value)
    dag_run = harvest.run()

    assert dag_run.state == "failed"
    assert task_states(dag_run)["begin"] == ("failed", 1)      # AirflowFailException: no retry
    out = capfd.readouterr()
    said = out.out + out.err + caplog.text
    failure = [line for line in said.splitlines() if "AirflowFailException" in line and "harvester_db" in line]
    assert failure and why in failure[0], said[-3000:]
    assert PASSWORD not in said
    assert never_started(setup)
    assert db.execute("SELECT count(*) FROM sync_runs").fetchone()[0] == 0


def test_a_secrets_backend_that_is_down_fails_the_run_with_retries(setup, harvest, db, capfd, caplog, monkeypatch):
    from harvester.testing.dagtest import secrets_backend

    monkeypatch.delenv("AIRFLOW_CONN_HARVESTER_DB")
    with secrets_backend(monkeypatch, f"{__name__}.UnreachableVault"):
        dag_run = harvest.run()

    assert dag_run.state == "failed"
    assert task_states(dag_run)["begin"] == ("failed", 2)      # may pass: retried
    out = capfd.readouterr()
    said = out.out + out.err + caplog.text
    assert ("DatabaseLookupError: could not look up the Airflow connection harvester_db in the secrets backend "
            "UnreachableVault: ConnectionError: vault.example:8200 did not answer") in said, said[-3000:]
    assert never_started(setup)


def test_no_connection_defined_and_embedded_off_fails_the_run(setup, harvest, capfd, caplog, monkeypatch):
    monkeypatch.delenv("AIRFLOW_CONN_HARVESTER_DB")
    monkeypatch.setenv("HARVESTER_EMBEDDED_DB", "off")
    dag_run = harvest.run()

    assert dag_run.state == "failed"
    assert task_states(dag_run)["begin"] == ("failed", 1)
    out = capfd.readouterr()
    said = out.out + out.err + caplog.text
    assert ("AirflowFailException: no Airflow connection harvester_db is defined, and HARVESTER_EMBEDDED_DB=off "
            "rules the embedded PostgreSQL out") in said, said[-3000:]
    assert never_started(setup)


@pytest.fixture
def embedded_is_the_test_server(pg_server, monkeypatch):
    """HARVESTER_HOME pointed at the tests' own embedded server, its `harvester` database fresh and
    empty: what a task falling back to the embedded server gets."""
    def recreate():
        with psycopg.connect(pg_server.url("postgres"), autocommit=True) as conn:
            conn.execute('DROP DATABASE IF EXISTS "harvester" WITH (FORCE)')
            conn.execute('CREATE DATABASE "harvester"')

    recreate()
    monkeypatch.setenv("HARVESTER_HOME", str(pg_server.home))
    yield pg_server.url("harvester")
    recreate()


def test_no_connection_defined_warns_and_harvests_into_the_embedded_server(
        setup, harvest, db, embedded_is_the_test_server, caplog, monkeypatch):
    monkeypatch.delenv("AIRFLOW_CONN_HARVESTER_DB")
    caplog.set_level(logging.WARNING, logger="harvester")
    assert harvest.run().state == "success"

    warnings = [r for r in caplog.records if r.name == "harvester.store.db" and r.levelno == logging.WARNING]
    assert warnings and all("no Airflow connection harvester_db is defined: using the embedded PostgreSQL"
                            in r.getMessage() for r in warnings)
    with psycopg.connect(embedded_is_the_test_server) as embedded:
        assert embedded.execute("SELECT count(*) FROM datasets").fetchone()[0] == 5
    assert db.execute("SELECT count(*) FROM datasets").fetchone()[0] == 0


# -- the CLI ------------------------------------------------------------------------------------
@pytest.fixture
def nothing_configured(monkeypatch, tmp_path):
    """The CLI with no database setting at all; an embedded server would live in tmp_path."""
    monkeypatch.delenv("HARVESTER_DATABASE_URL", raising=False)
    monkeypatch.delenv("AIRFLOW_CONN_HARVESTER_DB", raising=False)
    monkeypatch.setenv("HARVESTER_HOME", str(tmp_path))
    return tmp_path


def test_cli_with_embedded_off_and_nothing_configured_is_an_error(nothing_configured, monkeypatch, capsys):
    monkeypatch.setenv("HARVESTER_EMBEDDED_DB", "off")
    assert main(["runs"]) == 2
    err = capsys.readouterr().err
    assert "neither HARVESTER_DATABASE_URL nor AIRFLOW_CONN_HARVESTER_DB is set" in err
    assert "HARVESTER_EMBEDDED_DB=off" in err and "harvester_db" in err
    assert never_started(nothing_configured)


@pytest.mark.parametrize("variable, value, why", [
    ("HARVESTER_DATABASE_URL", f"postgresql://h:{PASSWORD}@127.0.0.1:notaport/h",
     f"HARVESTER_DATABASE_URL (postgresql://***@127.0.0.1:notaport/h) has a bad port"),
    ("HARVESTER_DATABASE_URL", f"mysql://h:{PASSWORD}@127.0.0.1/h",
     "HARVESTER_DATABASE_URL is not a PostgreSQL URI (mysql://***@127.0.0.1/h)"),
    ("AIRFLOW_CONN_HARVESTER_DB", '{"conn_type": "postgres", "password": "' + PASSWORD + '", "port": ',
     "AIRFLOW_CONN_HARVESTER_DB (the connection harvester_db) does not parse"),
], ids=["bad-port", "not-postgres", "broken-json"])
def test_cli_names_a_malformed_database_setting(nothing_configured, monkeypatch, capsys, variable, value, why):
    monkeypatch.setenv(variable, value)
    assert main(["runs"]) == 2
    err = capsys.readouterr().err
    assert why in err and PASSWORD not in err
    assert never_started(nothing_configured)


def test_a_mistyped_embedded_switch_is_named(nothing_configured, monkeypatch, capsys):
    monkeypatch.setenv("HARVESTER_EMBEDDED_DB", "of")
    assert main(["runs"]) == 2
    assert "HARVESTER_EMBEDDED_DB='of' is neither on nor off" in capsys.readouterr().err
    assert never_started(nothing_configured)
