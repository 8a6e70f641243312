"""A portal's secret never leaves (issue 35, finding 4): planted once as it should be (the token of
the Airflow connection conn_id names, defined by AIRFLOW_CONN_<ID>) and once as it must not be (in
the url, ``?api_key=<secret>``, which is refused), then looked for after real harvests through
Airflow (dag.test()) of a local DCAT catalogue over real HTTP, into a real PostgreSQL: in every
table of the Harvester database, Airflow's metadata database (the serialized DAG, its description
and docs), the Harvester UI's JSON (served by Airflow's own api-server app, with a real login), an
export and its manifest (the CLI), the notifications received, and the task logs and captured log
output. The catalogue server must have received it, in the header auth_header names, and nothing
else may hold it.

A second test stands for a deployment whose url carried a key before such urls were refused: its
rows still hold it, and what shows them (the DAG's description, the UI, an export) shows
``api_key=***``."""
from __future__ import annotations

import copy
import importlib.util
import json
import logging
import os
import uuid
from pathlib import Path

import pytest

from harvester.cli.main import main
from harvester.testing.leaks import airflow_home_text, database_text
from harvester.testing.samples import ROOT

SECRET = "Pl4nted-S3cret-of-the-catalogue-7e41c9"
LEGACY = "0ld-Url-K3y-d08a55"
CATALOGUE = ROOT.parent / "shared" / "dcat-samples" / "dcat-us" / "dcatus.json"
USERS = {"admin": "admin-pw-35"}


@pytest.fixture
def catalogue():
    from harvester.testing.dcat_portal import DcatServer

    with DcatServer() as server:
        yield server


def connection(monkeypatch, conn_id: str, **fields) -> None:
    """An Airflow connection, defined the way Airflow reads them from the environment."""
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps({"conn_type": "generic", **fields}))


def found(secret: str, places: dict[str, str]) -> dict[str, list[str]]:
    """Where ``secret`` is, each place with the text around every occurrence (what a failure shows)."""
    out = {}
    for where, text in places.items():
        at = [i for i in range(len(text)) if text.startswith(secret, i)]
        if at:
            out[where] = [text[max(0, i - 200):i + len(secret) + 40] for i in at[:3]]
    return out


def ui_client(monkeypatch, tmp_path):
    """Airflow's api-server app with the Harvester plugin, a simple auth manager with one admin, and
    that admin's real token."""
    from fastapi.testclient import TestClient

    from airflow.api_fastapi.app import create_app, purge_cached_app

    passwords = tmp_path / "passwords.json"
    passwords.write_text(json.dumps(USERS))
    monkeypatch.setenv("AIRFLOW__CORE__AUTH_MANAGER",
                       "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager")
    monkeypatch.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS", "admin:admin")
    monkeypatch.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE", str(passwords))
    monkeypatch.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS", "False")
    monkeypatch.setenv("AIRFLOW__API_AUTH__JWT_SECRET", uuid.uuid4().hex * 2)
    purge_cached_app()
    client = TestClient(create_app())
    response = client.post("/auth/token", json={"username": "admin", "password": USERS["admin"]})
    assert response.status_code == 201, response.text
    client.headers["Authorization"] = f"Bearer {response.json()['access_token']}"
    return client


def ui_json(client, db) -> str:
    """The Harvester UI's JSON: the portals, each portal and its runs, the changes, each run's report
    (and its CSV), a search."""
    paths = ["/harvester/api/portals", "/harvester/api/changes", "/harvester/api/changes?queue=true",
             "/harvester/api/search?q=commitments&mode=text"]
    for item in client.get("/harvester/api/portals").json()["items"]:
        paths += [f"/harvester/api/portals/{item['name']}", f"/harvester/api/portals/{item['name']}/runs"]
    paths += [f"/harvester/api/runs/{run_id}/outcomes{csv}" for (run_id,) in db.execute("SELECT run_id FROM sync_runs")
              for csv in ("", ".csv")]
    out = []
    for path in paths:
        response = client.get(path)
        assert response.status_code == 200, (path, response.status_code, response.text)
        out.append(f"{path}: {response.text}")
    return "\n".join(out)


def export(tmp_path, name: str) -> str:
    """An export of the datasets (with their raw records, removed ones too) and of the changes as
    JSON Lines by the CLI, the files and their manifests as text."""
    texts = []
    for what, extra in (("datasets", ["--raw", "--include-removed"]), ("changes", [])):
        directory = tmp_path / f"{name}-{what}"
        assert main(["export", what, "--format", "jsonl", "-o", str(directory), *extra]) == 0
        files = sorted(p for p in directory.iterdir() if p.is_file())
        assert any(p.name.endswith(".json") for p in files) and len(files) == 2, files
        texts += [p.read_text(encoding="utf-8") for p in files]
    return "\n".join(texts)


def test_a_secret_in_a_portal_url_never_leaves(harvest, catalogue, db, gemini, receiver, monkeypatch, tmp_path,
                                               caplog, capfd):
    caplog.set_level(logging.DEBUG)
    body = CATALOGUE.read_bytes()
    catalogue.set_document("/data.json", body)
    url = catalogue.url("/data.json")
    # 1. The key in the url: refused when the file is read, written there or from the environment,
    #    naming the portal and the parameter and saying the fix, never showing the key.
    monkeypatch.setenv("T_CATALOGUE_KEY", SECRET)
    for planted in (f"{url}?api_key={SECRET}", url + "?api_key=${T_CATALOGUE_KEY}"):
        harvest.configure(planted, type="dcat-json")
        from airflow.dag_processing.dagbag import DagBag

        bag = DagBag(dag_folder=str(ROOT / "dags" / "harvest_portals.py"))
        (error,) = bag.import_errors.values()
        assert "portals[0] (test): url has a secret in it: its parameter 'api_key' (value not shown)" in error
        assert ("put the token in an Airflow connection named by the portal's conn_id, as its password (e.g. "
                "conn_id: test_token and AIRFLOW_CONN_TEST_TOKEN=") in error
        assert "Harvester sends it in the header its auth_header names" in error
        assert SECRET not in error
        assert "harvest_test" not in bag.dag_ids
        assert main(["portals"]) == 2
        assert catalogue.requests == []

    # 2. The key where it belongs: the Airflow connection test_token, sent in the header named.
    connection(monkeypatch, "test_token", password=SECRET)
    notify = [{"webhook": receiver.base_url + "/hook", "on": ["failed", "degraded", "review"]}]
    harvest.configure(url, type="dcat-json", conn_id="test_token", auth_header="Authorization: Bearer {token}",
                      max_retries=0, notify=notify, significance={"review_threshold": 0.0})
    dag = harvest.dag()
    assert harvest.run().state == "success"  # new datasets, each to review (threshold 0): announced
    document = json.loads(body)
    retitled = copy.deepcopy(document)
    retitled["dataset"][0]["title"] += " (revised)"
    catalogue.set_document("/data.json", json.dumps(retitled).encode())
    assert harvest.run().state == "success"  # a change to review: announced
    del catalogue.documents["/data.json"]
    assert harvest.run().state == "failed"  # the catalogue gone (404): announced, with its error

    # The catalogue received the secret, in that header, on every request, and nowhere else.
    assert len(catalogue.requests) == 3
    assert [headers.get("Authorization") for _, headers in catalogue.requests] == [f"Bearer {SECRET}"] * 3
    assert [path for path, _ in catalogue.requests] == ["/data.json"] * 3
    # The runs did what they say: the datasets, a change, a failure, three notices.
    live = db.execute("SELECT count(*) FROM datasets WHERE removed_at IS NULL").fetchone()[0]
    assert live == len(document["dataset"])
    assert [b["outcome"] for b in receiver.bodies("/hook")] == ["review", "review", "failed"]

    places = {
        "the DAG's description and doc": f"{dag.description}\n{dag.doc_md}",
        "the harvester database": database_text(db),
        "Airflow's metadata database and files": airflow_home_text(Path(os.environ["AIRFLOW_HOME"])),
        "the Harvester UI's JSON": ui_json(ui_client(monkeypatch, tmp_path), db),
        "an export and its manifest": export(tmp_path, "export"),
        "the notifications": json.dumps(receiver.requests, default=str),
    }
    out, err = capfd.readouterr()  # (the export's CLI output too)
    places["the captured log records"] = caplog.text + "\n".join(str(r.args) + r.getMessage() for r in caplog.records)
    places["stdout and stderr"] = out + err
    # Each place is the one meant: it holds the portal (or its runs), so the search is not vacuous.
    for where, text in places.items():
        assert url in text or "harvest_test" in text, f"{where} says nothing of the portal: not searched"
    assert catalogue.url("/data.json") in places["the DAG's description and doc"]
    assert "Harvest " + url in places["Airflow's metadata database and files"]  # the serialized DAG
    assert '"runs"' in places["an export and its manifest"]
    assert found(SECRET, places) == {}


def test_a_url_stored_with_a_key_before_is_shown_without_it(harvest, catalogue, db, gemini, monkeypatch, tmp_path):
    """Rows written when a url with ?api_key= was still accepted keep it in portal_url: the DAG of
    such a portal (built from a Portal as it was), the UI and an export show it redacted."""
    from harvester.config.portals import Portal

    catalogue.set_document("/data.json", CATALOGUE.read_bytes())
    url = catalogue.url("/data.json")
    harvest.configure(url, type="dcat-json", significance={"review_threshold": 0.0})
    assert harvest.run().state == "success"
    old = f"{url}?api_key={LEGACY}"
    tables = db.execute("SELECT c.table_name FROM information_schema.columns c JOIN information_schema.tables t"
                        " USING (table_schema, table_name) WHERE c.column_name = 'portal_url'"
                        " AND c.table_schema = 'public' AND t.table_type = 'BASE TABLE'").fetchall()
    assert len(tables) > 3
    for (table,) in tables:
        db.execute(f'UPDATE "{table}" SET portal_url = %s WHERE portal_url = %s', (old, url))
    assert LEGACY in database_text(db)

    spec = importlib.util.spec_from_file_location("harvest_portals_legacy", ROOT / "dags" / "harvest_portals.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    dag = module.build(Portal(name="legacy", url=old, type="dcat-json"))
    assert dag.description == f"Harvest {url}?api_key=***"
    places = {
        "the DAG's description and doc": f"{dag.description}\n{dag.doc_md}",
        "the Harvester UI's JSON": ui_json(ui_client(monkeypatch, tmp_path), db),
        "an export and its manifest": export(tmp_path, "legacy"),
    }
    for where, text in places.items():
        assert f"{url}?api_key=***" in text, f"{where} does not show the old url: not searched"
    assert found(LEGACY, places) == {}
