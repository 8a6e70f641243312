"""Operating harvest_<portal> through Airflow: a failed run resumes when its failed task (or the
whole DAG run) is cleared, with the same outcome as an unbroken run; one writer per portal.

Failures are injected from outside our code: a PostgreSQL trigger that refuses writes (as a full
disk or a lost connection would), and a Gemini-protocol server that refuses the key mid-run.
Clearing goes through Airflow's own `airflow tasks clear` command.
"""
import copy
import logging

import psycopg
import pytest

from harvester.cli.main import main
from harvester.store import runs as store_runs

from harvester.testing.samples import distinct_records

HUMDATA = "data-humdata-org.jsonl"
OUTCOME_STATS = ("fetched", "created", "updated", "unchanged", "failed", "skipped", "removed", "embedded",
                 "embeddings_reused", "versions", "review")


@pytest.fixture
def other_database(new_database, monkeypatch):
    """A second fresh database: its URL, and a function that switches the harvester (CLI and
    Airflow connection) to a database and returns its URL."""
    def use(target):
        monkeypatch.setenv("HARVESTER_DATABASE_URL", target)
        monkeypatch.setenv("AIRFLOW_CONN_HARVESTER_DB", target)
        return target

    return new_database(), use


def outcome(conn) -> dict:
    """Everything a run leaves that users see, without timestamps and ids."""
    runs = conn.execute("SELECT status, mode, stats FROM sync_runs ORDER BY run_id").fetchall()
    return {
        "runs": [(status, mode, {k: stats.get(k) for k in OUTCOME_STATS}) for status, mode, stats in runs],
        "datasets": conn.execute(
            "SELECT source_id, content_hash, metadata_hash, embedded_content_hash, removed_at IS NULL FROM datasets"
            " ORDER BY source_id").fetchall(),
        "versions": conn.execute("SELECT d.source_id, v.content_hash, v.metadata_hash FROM dataset_versions v"
                                 " JOIN datasets d ON d.id = v.dataset_id ORDER BY 1, 2, 3").fetchall(),
        "changes": conn.execute("SELECT d.source_id, c.change_type, c.requires_review, c.significance_score,"
                                " c.changed_fields::text"
                                " FROM dataset_changes c JOIN datasets d ON d.id = c.dataset_id"
                                " ORDER BY 1, 2").fetchall(),
        "embeddings": conn.execute("SELECT count(*) FROM embeddings").fetchone()[0],
        "status": conn.execute("SELECT last_sync_mode, sync_status, datasets_synced FROM portal_sync_status").fetchall(),
        "staging": conn.execute("SELECT (SELECT count(*) FROM staging_records) + (SELECT count(*) FROM staging_changes)"
                                " + (SELECT count(*) FROM staging_listing)").fetchone()[0],
    }


def two_runs(harvest, portal_server, samples):
    """The scenario: a full sync of a portal, then the portal changes (six datasets gone, two
    retitled, one with a new description) and the next run is a full sync."""
    records = samples(HUMDATA)
    portal_server.set_records(records)
    assert harvest.run(full_sync=True).state == "success"
    changed = copy.deepcopy(records[6:])
    changed[0]["title"] += " (revised)"
    changed[1]["title"] = "A different title altogether"
    changed[2]["notes"] = (changed[2].get("notes") or "") + " Now also covering 2026."
    portal_server.set_records(changed)


def unbroken(harvest, portal_server, samples, other_database, database_url) -> dict:
    url, use = other_database
    use(url)
    two_runs(harvest, portal_server, samples)
    assert harvest.run(full_sync=True).state == "success"
    with psycopg.connect(url) as conn:
        reference = outcome(conn)
    use(database_url)
    return reference


INJECT = """
CREATE FUNCTION injected_failure() RETURNS trigger LANGUAGE plpgsql AS
$$ BEGIN RAISE EXCEPTION 'could not extend file: No space left on device (injected)'; END $$;
CREATE TRIGGER injected_failure BEFORE INSERT ON dataset_versions
    FOR EACH STATEMENT EXECUTE FUNCTION injected_failure();
"""
FIX = "DROP TRIGGER injected_failure ON dataset_versions; DROP FUNCTION injected_failure();"


def test_clearing_the_failed_upsert_completes_the_run_as_if_nothing_failed(
        harvest, portal_server, db, samples, other_database, database_url):
    harvest.configure(portal_server.base_url)
    reference = unbroken(harvest, portal_server, samples, other_database, database_url)
    assert reference["runs"][1][2]["removed"] == 6 and reference["runs"][1][2]["updated"] == 3

    two_runs(harvest, portal_server, samples)
    watermark = db.execute("SELECT last_successful_sync FROM portal_sync_status").fetchone()
    db.execute(INJECT)
    dag_run = harvest.run(full_sync=True)
    assert dag_run.state == "failed"
    assert harvest.task_states(dag_run)[("upsert", -1)] == "failed"
    run_id, status, resumable, error = db.execute(
        "SELECT run_id, status, resumable, error FROM sync_runs ORDER BY run_id DESC LIMIT 1").fetchone()
    assert (status, resumable) == ("failed", True) and "No space left on device" in error
    assert db.execute("SELECT count(*) FROM staging_records WHERE run_id = %s", (run_id,)).fetchone()[0] > 0
    assert db.execute("SELECT last_successful_sync FROM portal_sync_status").fetchone() == watermark

    db.execute(FIX)  # the operator frees the disk, then clears the failed task with its downstream
    harvest.clear(dag_run, "upsert")
    dag_run = harvest.resume(dag_run)
    assert dag_run.state == "success"
    states = harvest.task_states(dag_run)
    assert states[("upsert", -1)] == "success" and states[("begin", -1)] == "success"
    assert outcome(db) == reference
    assert db.execute("SELECT count(*) FROM sync_runs").fetchone()[0] == 2


def test_clearing_the_whole_dag_run_reopens_its_run(harvest, portal_server, db, samples, other_database, database_url):
    harvest.configure(portal_server.base_url)
    reference = unbroken(harvest, portal_server, samples, other_database, database_url)

    two_runs(harvest, portal_server, samples)
    db.execute(INJECT)
    dag_run = harvest.run(full_sync=True)
    assert dag_run.state == "failed"
    failed_run = db.execute("SELECT max(run_id) FROM sync_runs").fetchone()[0]
    db.execute(FIX)
    harvest.clear(dag_run)
    dag_run = harvest.resume(dag_run)
    assert dag_run.state == "success"
    # The same run, reopened: no second run row, no failed run left behind.
    assert db.execute("SELECT max(run_id), count(*) FROM sync_runs").fetchone() == (failed_run, 2)
    got = outcome(db)
    assert got == reference
    # The portal was read twice (both attempts are counted), the datasets once.
    requests = db.execute("SELECT stats->>'portal_requests' FROM sync_runs WHERE run_id = %s",
                          (failed_run,)).fetchone()[0]
    assert int(requests) >= 2


def test_clearing_a_failed_embed_changed_embeds_only_what_is_missing(harvest, portal_server, db, samples, gemini,
                                                                     other_database, database_url, monkeypatch):
    monkeypatch.setenv("HARVESTER_EMBED_CONCURRENCY", "1")  # the batches in order: the last one is refused
    records = distinct_records(samples, 250)
    portal_server.set_records(records)
    harvest.configure(portal_server.base_url)
    url, use = other_database
    use(url)
    assert harvest.run().state == "success"
    with psycopg.connect(url) as conn:
        reference = outcome(conn)
    use(database_url)
    assert reference["runs"][0][2]["embedded"] == 250

    gemini.requests.clear()
    gemini.fail_next(2, status=None)  # two batches of 100 go through...
    gemini.fail_next(1, status=401)   # ...then the key is refused (rotated): the task fails at once
    dag_run = harvest.run()
    assert dag_run.state == "failed"
    assert harvest.task_states(dag_run)[("embed_changed", 0)] == "failed"
    assert db.execute("SELECT status, resumable FROM sync_runs").fetchone() == ("failed", True)
    assert db.execute("SELECT count(*) FROM embeddings").fetchone()[0] == 200

    gemini.requests.clear()  # a new key is in place; the operator clears embed_changed and upsert
    harvest.clear(dag_run, "embed_changed")
    dag_run = harvest.resume(dag_run)
    assert dag_run.state == "success"
    assert [len(body["requests"]) for _, _, body in gemini.requests] == [50]  # only what was missing
    assert outcome(db) == reference
    stats = db.execute("SELECT stats FROM sync_runs").fetchone()[0]
    assert (stats["embedded"], stats["embedding_requests"]) == (250, 4)  # 3 + the refused one, each counted once


def test_a_superseded_run_cannot_be_resumed_and_says_so(harvest, portal_server, db, samples, caplog, capfd):
    portal_server.set_records(samples("data-birmingham-gov-uk.jsonl"))
    harvest.configure(portal_server.base_url)
    db.execute(INJECT)
    failed = harvest.run(full_sync=True)
    assert failed.state == "failed"
    db.execute(FIX)
    assert harvest.run().state == "success"  # the next run supersedes the failed one
    harvest.clear(failed, "upsert")
    caplog.set_level(logging.INFO)
    assert harvest.resume(failed).state == "failed"
    out, err = capfd.readouterr()
    logged = out + err + caplog.text
    assert "AirflowFailException: run 1 of test is failed and cannot be resumed" in logged
    assert "superseded by run 2" in logged
    assert [r[0] for r in db.execute("SELECT status FROM sync_runs ORDER BY run_id")] == ["failed", "committed"]


# -- one writer per portal ----------------------------------------------------------------------
def configure_cli(tmp_path, monkeypatch, url, **extra):
    import yaml

    path = tmp_path / "portals.yaml"
    path.write_text(yaml.safe_dump({"portals": [{"name": "test", "url": url, "politeness_delay": 0, **extra}]}))
    monkeypatch.setenv("HARVESTER_PORTALS_FILE", str(path))


def test_the_cli_refuses_while_a_dag_run_harvests_and_takes_over_when_told(
        db, portal_server, samples, tmp_path, monkeypatch, capsys):
    portal_server.set_records(samples("data-birmingham-gov-uk.jsonl"))
    configure_cli(tmp_path, monkeypatch, portal_server.base_url)
    # What a DAG run in the middle of its tasks leaves in the database.
    held = store_runs.start(db, portal_url=portal_server.base_url, portal_name="test",
                            dag_run_id="scheduled__2026-11-22T00:00:00+00:00", mode="full", since=None)
    assert main(["harvest", "test"]) == 2
    err = capsys.readouterr().err
    assert f"run {held.run_id}" in err and "DAG run scheduled__2026-11-22T00:00:00+00:00" in err and "--takeover" in err
    assert store_runs.get(db, held.run_id).status == "running"
    assert db.execute("SELECT count(*) FROM sync_runs").fetchone()[0] == 1

    assert main(["harvest", "test", "--takeover", "--json"]) == 0
    assert store_runs.get(db, held.run_id).status == "cancelled"
    assert "aborted on request (takeover)" in store_runs.get(db, held.run_id).error
    assert db.execute("SELECT status FROM sync_runs ORDER BY run_id DESC LIMIT 1").fetchone()[0] == "committed"


def test_a_dag_run_refuses_while_the_cli_harvests_then_takes_over(harvest, portal_server, db, samples, caplog,
                                                                  capfd, monkeypatch):
    portal_server.set_records(samples("data-birmingham-gov-uk.jsonl"))
    harvest.configure(portal_server.base_url)
    monkeypatch.setenv("HARVESTER_BUSY_POLL_SECS", "1")  # begin waits for the CLI run 2s, then gives up
    monkeypatch.setenv("HARVESTER_BUSY_WAIT_SECS", "2")
    cli = store_runs.start(db, portal_url=portal_server.base_url, portal_name="test", dag_run_id=None,
                           mode="full", since=None)
    caplog.set_level(logging.INFO)
    refused = harvest.run()
    assert refused.state == "failed"
    assert harvest.task_states(refused)[("begin", -1)] == "failed"
    out, err = capfd.readouterr()
    text = out + err + caplog.text
    assert f"test is being harvested by run {cli.run_id}" in text and "the CLI (harvester harvest)" in text
    assert store_runs.get(db, cli.run_id).status == "running"

    assert harvest.run(takeover=True).state == "success"
    assert store_runs.get(db, cli.run_id).status == "cancelled"


def test_a_dead_run_is_abandoned_by_the_next_dag_run(harvest, portal_server, db, samples):
    portal_server.set_records(samples("data-birmingham-gov-uk.jsonl"))
    harvest.configure(portal_server.base_url, stale_after="30m")
    dead = store_runs.start(db, portal_url=portal_server.base_url, portal_name="test",
                            dag_run_id="scheduled__1", mode="full", since=None)
    db.execute("UPDATE sync_runs SET heartbeat_at = now() - interval '31 minutes' WHERE run_id = %s", (dead.run_id,))
    assert harvest.run().state == "success"
    run = store_runs.get(db, dead.run_id)
    assert run.status == "abandoned" and "no progress for 31m (stale_after 30m)" in run.error


def test_force_removals_through_the_cli(db, portal_server, samples, tmp_path, monkeypatch, capsys):
    import json

    records = samples("data-humdata-org.jsonl")
    portal_server.set_records(records)
    configure_cli(tmp_path, monkeypatch, portal_server.base_url)
    assert main(["harvest", "test", "--json"]) == 0
    capsys.readouterr()
    portal_server.set_records(records[:20])  # half of the portal gone: over max_removal_share (20%)
    assert main(["harvest", "test", "--full", "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["removed"] == 0 and stats["removals_withheld"] == len(records) - 20
    assert main(["harvest", "test", "--full", "--force-removals", "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["removed"] == len(records) - 20 and "removals_withheld" not in stats
    live = db.execute("SELECT count(*) FROM datasets WHERE removed_at IS NULL").fetchone()[0]
    assert live == 20
