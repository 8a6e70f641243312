"""Credentials: a portal's CKAN API token from an Airflow connection (conn_id), private datasets,
and user:password in portal URLs, which reach only the HTTP client: never the DAG, a log, an error
text, the Asset URI or the database."""
from __future__ import annotations

import base64
import json
import logging
import os
from pathlib import Path

import pytest
import yaml

from harvester.cli.main import main
from harvester.config.portals import parse_portals
from harvester.testing.leaks import airflow_home_text, database_text

BIRMINGHAM = "data-birmingham-gov-uk.jsonl"
TOKEN = "ckan-token-Pr1vate-5f0d9c"


def connection(monkeypatch, conn_id: str, **fields) -> None:
    """An Airflow connection, defined the way Airflow reads them from the environment."""
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps({"conn_type": "generic", **fields}))


def portal(**entry):
    (p,) = parse_portals({"portals": [{"name": "x", "url": "https://x.example.org", **entry}]})
    return p


def held_ids(db):
    return {r[0] for r in db.execute("SELECT source_id FROM datasets WHERE removed_at IS NULL").fetchall()}


# -- the token's connection -------------------------------------------------------------------------
def test_api_key_is_the_connections_password_or_extra_api_key(monkeypatch):
    from harvester.config.credentials import api_key

    assert api_key(portal()) is None
    connection(monkeypatch, "ckan_pw", password=TOKEN, extra={"api_key": "not-this-one"})
    assert api_key(portal(conn_id="ckan_pw")) == TOKEN
    connection(monkeypatch, "ckan_extra", extra={"api_key": TOKEN})
    assert api_key(portal(conn_id="ckan_extra")) == TOKEN


def test_a_missing_or_empty_connection_is_named_with_the_portal(monkeypatch):
    from harvester.config.credentials import CredentialsError, api_key

    with pytest.raises(CredentialsError) as info:
        api_key(portal(conn_id="ckan_nowhere"))
    assert str(info.value).startswith("portal x: conn_id 'ckan_nowhere': there is no Airflow connection "
                                      "'ckan_nowhere'; create it with the portal's CKAN API token as its password")
    connection(monkeypatch, "ckan_empty", login="someone", extra={"timeout": 3})
    with pytest.raises(CredentialsError, match="portal x: conn_id 'ckan_empty': the Airflow connection has neither "
                                               "a password nor an extra api_key"):
        api_key(portal(conn_id="ckan_empty"))


def test_private_datasets_are_harvested_with_the_connection_only(harvest, portal_server, db, samples, monkeypatch,
                                                                caplog, capfd):
    caplog.set_level(logging.DEBUG)
    records = samples(BIRMINGHAM)
    private = [dict(r, private=True) for r in records[:3]]
    public = records[3:]
    portal_server.set_records(private + public)
    portal_server.api_tokens = {TOKEN}

    harvest.configure(portal_server.base_url)
    assert harvest.run().state == "success"
    assert held_ids(db) == {r["id"] for r in public}
    assert all("Authorization" not in h for h in portal_server.request_headers)

    connection(monkeypatch, "ckan_test_token", password=TOKEN)
    harvest.configure(portal_server.base_url, conn_id="ckan_test_token")
    portal_server.requests.clear()
    portal_server.request_headers.clear()
    # an incremental run: the portal now counts 10 datasets where we hold 7, so it reconciles
    assert harvest.run().state == "success"
    assert held_ids(db) == {r["id"] for r in private + public}
    assert all(h.get("Authorization") == TOKEN for h in portal_server.request_headers)
    assert all(params.get("include_private") == "true" for action, params in portal_server.requests
               if action == "package_search")
    out, err = capfd.readouterr()
    assert "reconcil" in caplog.text
    for where, text in {"logs": caplog.text + out + err, "database": database_text(db),
                        "Airflow files": airflow_home_text(Path(os.environ["AIRFLOW_HOME"]))}.items():
        assert TOKEN not in text, f"the API token is in the {where}"


def test_missing_connection_fails_the_run_naming_it(harvest, portal_server, db, samples, caplog):
    portal_server.set_records(samples(BIRMINGHAM))
    harvest.configure(portal_server.base_url, conn_id="ckan_not_defined")
    assert harvest.run().state == "failed"
    (error,) = db.execute("SELECT error FROM sync_runs").fetchone()
    assert "portal test: conn_id 'ckan_not_defined': there is no Airflow connection 'ckan_not_defined'" in error
    assert portal_server.requests == []


def test_cli_harvest_uses_the_connection_too(database_url, portal_server, samples, tmp_path, monkeypatch, capsys):
    records = samples(BIRMINGHAM)
    portal_server.set_records([dict(r, private=True) for r in records[:2]] + records[2:])
    portal_server.api_tokens = {TOKEN}
    connection(monkeypatch, "ckan_cli_token", extra={"api_key": TOKEN})
    path = tmp_path / "portals.yaml"
    path.write_text(yaml.safe_dump({"portals": [{"name": "clitest", "url": portal_server.base_url,
                                                 "politeness_delay": 0, "conn_id": "ckan_cli_token"}]}))
    monkeypatch.setenv("HARVESTER_PORTALS_FILE", str(path))
    assert main(["harvest", "clitest", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["created"] == len(records)
    monkeypatch.delenv("AIRFLOW_CONN_CKAN_CLI_TOKEN")
    assert main(["harvest", "clitest"]) == 2
    assert "conn_id 'ckan_cli_token': there is no Airflow connection" in capsys.readouterr().err


# -- user:password in the URL -----------------------------------------------------------------------
LITERAL = "Lit3ral-Pw-7c1e0b"
FROM_ENV = "Env-Pw-93ab/x@y"  # characters a URL could not hold literally


def test_url_credentials_never_reach_the_dag_logs_errors_or_database(harvest, portal_server, db, samples,
                                                                     monkeypatch, caplog, capfd):
    from harvester.pipeline import tasks
    from harvester.config.portals import get_portal

    caplog.set_level(logging.DEBUG)
    records = samples(BIRMINGHAM)
    portal_server.set_records(records)
    host = portal_server.base_url.removeprefix("http://")

    harvest.configure(f"http://harvest:{LITERAL}@{host}", max_retries=1)
    dag = harvest.dag()
    assert harvest.run().state == "success"
    monkeypatch.setenv("T_PORTAL_PASSWORD", FROM_ENV)
    harvest.configure(f"http://robot:${{T_PORTAL_PASSWORD}}@{host}", max_retries=1)
    dag_env = harvest.dag()
    assert harvest.run().state == "success"
    # the portal down: the run fails, with an error text in the run and in the logs
    portal_server.fail_actions = {"*": 503}
    assert harvest.run().state == "failed"
    (error,) = db.execute("SELECT error FROM sync_runs ORDER BY run_id DESC").fetchone()
    assert "PortalUnavailable" in error and f"http://{host} package_search" in error

    # The credentials were used: each run's requests carried them as HTTP Basic auth.
    sent = {h.get("Authorization") for h in portal_server.request_headers}
    assert sent == {"Basic " + base64.b64encode(f"harvest:{LITERAL}".encode()).decode(),
                    "Basic " + base64.b64encode(f"robot:{FROM_ENV}".encode()).decode()}
    assert get_portal("test").url == portal_server.base_url
    assert len(db.execute("SELECT * FROM sync_runs").fetchall()) == 3
    assert db.execute("SELECT count(*) FROM datasets").fetchone()[0] == len(records)

    out, err = capfd.readouterr()
    places = {
        "DAG description and doc": "\n".join(f"{d.description}\n{d.doc_md}" for d in (dag, dag_env)),
        "Asset URIs": "\n".join([tasks.asset_uri(get_portal("test"))]
                                + [o.uri for d in (dag, dag_env) for t in d.tasks for o in t.outlets]),
        "captured log records": caplog.text + "\n".join(str(r.args) + r.getMessage() for r in caplog.records),
        "stdout and stderr": out + err,
        "Airflow task logs and metadata": airflow_home_text(Path(os.environ["AIRFLOW_HOME"])),
        "harvester database": database_text(db),
    }
    assert "harvester://test/datasets" in places["Asset URIs"]
    assert "PortalUnavailable" in places["captured log records"]
    assert "harvest_test" in places["Airflow task logs and metadata"]
    assert portal_server.base_url in places["DAG description and doc"]
    for secret in (LITERAL, FROM_ENV, "Env-Pw-93ab"):
        leaks = [where for where, text in places.items() if secret in text]
        assert leaks == [], f"{secret!r} found in {leaks}"
