"""Errors decide their own retry, through real Airflow (dag.test()), real HTTP and a real PostgreSQL:
with retries configured (HARVESTER_TASK_RETRIES=2), a terminal error (a catalogue that is not one,
a refused request, missing credentials, bad configuration) fails its task on the first try with
one message naming the cause and the portal, and the failure callbacks still mark the run failed
and announce it; a transient one (the portal answering 503) is retried and the run succeeds.

dag.test() retries like the scheduler does: a task that failed with retries left is up_for_retry,
and its loop runs it again once the retry delay has passed (HARVESTER_TASK_RETRY_DELAY_SECS=0
here, a second at most with the exponential backoff)."""
from __future__ import annotations

import logging

import pytest

BIRMINGHAM = "data-birmingham-gov-uk.jsonl"
NOT_RETRIED = "not retried, trying again would fail the same way)"
PASSWORD = "Catal0gue-Pw-8d2f"


@pytest.fixture(autouse=True)
def retries(monkeypatch):
    """Two retries without delay (conftest sets none): read when the DAG file is parsed, each run."""
    monkeypatch.setenv("HARVESTER_TASK_RETRIES", "2")
    monkeypatch.setenv("HARVESTER_TASK_RETRY_DELAY_SECS", "0")


def tries(dag_run) -> dict[str, tuple[str, int]]:
    """task id -> (state, try number) of the DAG run's task instances."""
    return {ti.task_id: (str(ti.state), ti.try_number) for ti in dag_run.get_task_instances()}


def last_run(db):
    return db.execute("SELECT status, error FROM sync_runs ORDER BY run_id DESC LIMIT 1").fetchone()


def failed_once(dag_run, task_id: str) -> None:
    """The DAG run failed at ``task_id``, on its first try (no retry), and ran nothing after it."""
    states = tries(dag_run)
    assert dag_run.state == "failed"
    assert states[task_id] == ("failed", 1), states
    later = {"fetch_modified": ["reconcile", "hash_compare", "embed_changed", "upsert"],
             "hash_compare": ["embed_changed", "upsert"], "embed_changed": ["upsert"]}.get(task_id, [])
    assert all(states[t][0] == "upstream_failed" for t in later if t in states), states


def said(capfd, caplog) -> str:
    out, err = capfd.readouterr()
    return out + err + caplog.text


# -- terminal: the first try is the last ------------------------------------------------------------
@pytest.mark.parametrize("kind, error, cause", [
    ("dcat-json", "InvalidCatalogue", "not a valid JSON document"),
    ("dcat-rdf", "RdfParseError", "not readable as a DCAT catalogue"),
])
def test_a_catalogue_that_is_not_one_fails_fetch_modified_on_its_first_try(harvest, catalogue, db, gemini, capfd,
                                                                           caplog, kind, error, cause):
    catalogue.set_document("/catalog", b"<html><body><h1>Down for maintenance</h1></body></html>", "text/html")
    harvest.configure(catalogue.url("/catalog").replace("//", f"//harvester:{PASSWORD}@"), type=kind, max_retries=0)
    dag_run = harvest.run()

    failed_once(dag_run, "fetch_modified")
    status, message = last_run(db)
    assert status == "failed"
    assert message.startswith(f"AirflowFailException: {catalogue.url('/catalog')}: {cause}"), message
    assert message.endswith(f"(portal test, {error}: {NOT_RETRIED}")
    assert [path for path, _ in catalogue.requests if path == "/catalog"] == ["/catalog"]  # read once
    assert PASSWORD not in said(capfd, caplog)


def test_a_request_the_portal_refuses_fails_fetch_modified_on_its_first_try(harvest, portal_server, db, samples,
                                                                           gemini, capfd, caplog):
    portal_server.set_records(samples(BIRMINGHAM))
    harvest.configure(portal_server.base_url, max_retries=0)
    portal_server.fail_next(1, 403, action="package_search", body={
        "help": "x", "success": False, "error": {"__type": "Authorization Error", "message": "Access denied"}})
    dag_run = harvest.run()  # a retry would have gone through: the refusal is served once

    failed_once(dag_run, "fetch_modified")
    logged = said(capfd, caplog)
    (run_id,) = db.execute("SELECT max(run_id) FROM sync_runs").fetchone()
    status, message = last_run(db)
    assert status == "failed"
    assert message == (f"AirflowFailException: {portal_server.base_url} package_search: HTTP 403 Authorization "
                       f"Error: Access denied (portal test, CkanError: {NOT_RETRIED}")
    assert [action for action, _ in portal_server.requests] == ["package_search"]
    assert f"fetch_modified: run {run_id} of test failed in this try (not retried); the run's page: " in logged


def test_missing_credentials_fail_fetch_modified_on_its_first_try_and_are_announced(
        harvest, portal_server, db, samples, gemini, receiver, monkeypatch):
    monkeypatch.delenv("AIRFLOW_CONN_CKAN_NOT_DEFINED", raising=False)
    portal_server.set_records(samples(BIRMINGHAM))
    harvest.configure(portal_server.base_url, conn_id="ckan_not_defined",
                      notify=[{"webhook": receiver.base_url + "/failed", "on": ["failed"]}])
    dag_run = harvest.run()

    failed_once(dag_run, "fetch_modified")
    assert portal_server.requests == []
    status, message = last_run(db)  # the task's failure callback marked the run failed
    assert status == "failed"
    assert message.startswith("AirflowFailException: portal test: conn_id 'ckan_not_defined': there is no Airflow "
                              "connection 'ckan_not_defined'; create it")
    assert message.endswith(f"Error: {NOT_RETRIED}")  # (CredentialsError, wherever it lives)
    # ...and the DAG's failure callback announced it, with that message
    bodies = [body for path, _, body in receiver.requests if path == "/failed"]
    assert [(b["outcome"], b["dag_run_id"], b["error"]) for b in bodies] == [("failed", dag_run.run_id, message)]


@pytest.mark.parametrize("variable, value, task_id, cause", [
    ("HARVESTER_EMBEDDING_PROVIDER", "nope", "hash_compare", "HARVESTER_EMBEDDING_PROVIDER='nope'"),
    ("GEMINI_API_KEY", "AIza-REVOKED-SECRET-31337", "embed_changed", "Gemini rejected the API key"),
    ("HARVESTER_EMBED_ATTEMPTS", "many", "hash_compare", "HARVESTER_EMBED_ATTEMPTS='many'"),
    ("CB_FAILURE_THRESHOLD", "many", "embed_changed", "CB_FAILURE_THRESHOLD='many'"),
], ids=["unknown-provider", "rejected-key", "bad-embed-setting", "bad-breaker-setting"])
def test_bad_configuration_fails_its_task_on_the_first_try(harvest, portal_server, db, samples, gemini, monkeypatch,
                                                           variable, value, task_id, cause):
    portal_server.set_records(samples(BIRMINGHAM))
    harvest.configure(portal_server.base_url)
    monkeypatch.setenv(variable, value)
    dag_run = harvest.run()

    failed_once(dag_run, task_id)
    status, message = last_run(db)
    assert status == "failed"
    assert message.startswith("AirflowFailException: ") and cause in message, message
    assert "(portal test, " in message and message.endswith(NOT_RETRIED), message
    assert "REVOKED-SECRET" not in message
    assert db.execute("SELECT count(*) FROM datasets").fetchone()[0] == 0
    assert db.execute("SELECT count(*) FROM circuit_breakers WHERE state <> 'closed'").fetchone()[0] == 0


def test_a_bad_database_setting_fails_begin_on_its_first_try(harvest, portal_server, db, samples, gemini, monkeypatch,
                                                             capfd, caplog):
    caplog.set_level(logging.INFO)
    portal_server.set_records(samples(BIRMINGHAM))
    harvest.configure(portal_server.base_url)
    monkeypatch.setenv("HARVESTER_LOCK_TIMEOUT_SECS", "forever")
    dag_run = harvest.run()

    failed_once(dag_run, "begin")
    failures = [line for line in said(capfd, caplog).splitlines()
                if "AirflowFailException" in line and "HARVESTER_LOCK_TIMEOUT_SECS" in line]
    assert failures and all("(portal test, DatabaseConfigError: " + NOT_RETRIED in line for line in failures), failures
    assert db.execute("SELECT count(*) FROM sync_runs").fetchone()[0] == 0  # no run was opened


# -- transient: retried ------------------------------------------------------------------------------
def test_a_portal_answering_503_is_retried_and_the_run_succeeds(harvest, portal_server, db, samples, gemini,
                                                                capfd, caplog):
    records = samples(BIRMINGHAM)
    portal_server.set_records(records)
    harvest.configure(portal_server.base_url, max_retries=0)  # no HTTP retries: the task's retry is the one
    portal_server.fail_next(1, 503)  # the first API request of the run
    dag_run = harvest.run()

    assert dag_run.state == "success"
    states = tries(dag_run)
    assert states["fetch_modified"] == ("success", 2), states  # failed once, retried by Airflow
    assert states["begin"] == ("success", 1) and states["upsert"] == ("success", 1), states
    assert last_run(db) == ("committed", None)
    assert db.execute("SELECT count(*) FROM datasets").fetchone()[0] == len({r["id"] for r in records})
    logged = said(capfd, caplog)
    assert "PortalUnavailable" in logged and "portal unavailable after 1 attempts (last: HTTP 503)" in logged
    assert "AirflowFailException" not in logged
    # the failed try's log ends, like a finished one's, with the run's page
    (run_id,) = db.execute("SELECT max(run_id) FROM sync_runs").fetchone()
    assert (f"fetch_modified: run {run_id} of test failed in this try (Airflow retries it if it has tries left); "
            f"the run's page: ") in logged and f"/harvester/runs/{run_id}" in logged
