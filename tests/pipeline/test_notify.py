"""Degraded runs announced, through real Airflow (dag.test()): the Asset event's extra says what a
run skipped or withheld, a portal's notify: list sends failed, degraded and needs-review runs
through Airflow notifiers (the shipped webhook one, or any class by import path) to a local HTTP
receiver, a receiver that is down never fails a run, and the example consumer does nothing on
events of runs that changed nothing."""
import logging
import socket
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import quote

import pytest
import yaml

from harvester.testing.samples import edited

ROOT = Path(__file__).resolve().parents[2]
BIRMINGHAM = "data-birmingham-gov-uk.jsonl"
TOKEN = "hook-token-s3cr3t-4242"



def last_run(db):
    return db.execute("SELECT run_id, status, stats, error FROM sync_runs ORDER BY run_id DESC LIMIT 1").fetchone()


def asset_events():
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session

    with create_session() as session:
        events = (session.query(AssetEvent).join(AssetModel, AssetEvent.asset_id == AssetModel.id)
                  .filter(AssetModel.uri == "harvester://test/datasets").order_by(AssetEvent.id).all())
        return [(e.id, e.extra) for e in events]


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_clean_run_says_nothing_and_a_run_needing_review_is_announced(harvest, portal_server, db, samples,
                                                                         receiver, monkeypatch):
    monkeypatch.setenv("AIRFLOW__API__BASE_URL", "https://airflow.example.org/")
    records = samples(BIRMINGHAM)
    portal_server.set_records(records)
    harvest.configure(portal_server.base_url, significance={"review_threshold": 0.3},
                      notify=[{"webhook": f"{receiver.base_url}/hook"}])
    assert harvest.run().state == "success"
    assert last_run(db)[2]["created"] == len(records)
    assert receiver.requests == [], "a clean run announces nothing"

    portal_server.upsert_record(edited(records[2], title="Retitled"))
    dag_run = harvest.run()
    assert dag_run.state == "success"
    run_id, status, stats, _ = last_run(db)
    assert (status, stats["review"]) == ("committed", 1)
    (body,) = receiver.bodies("/hook")
    assert body["outcome"] == "review" and body["outcomes"] == ["review"]
    assert (body["portal"], body["dag_id"], body["dag_run_id"], body["run_id"]) == (
        "test", "harvest_test", dag_run.run_id, run_id)
    assert body["counts"]["review"] == 1 and body["counts"]["updated"] == 1 and body["counts"]["skipped"] == 0
    assert body["url"] == f"https://airflow.example.org/dags/harvest_test/runs/{quote(dag_run.run_id, safe='')}"
    assert "1 changes need review" in body["message"]


def test_withheld_removals_are_degraded_in_the_asset_event_and_the_webhook_without_leaking_its_token(
        harvest, portal_server, db, samples, receiver, monkeypatch, caplog, capsys):
    monkeypatch.setenv("HOOK_TOKEN", TOKEN)
    records = samples(BIRMINGHAM)
    portal_server.set_records(records)
    harvest.configure(portal_server.base_url, notify=[{"webhook": receiver.base_url + "/hooks/${HOOK_TOKEN}"}])
    assert harvest.run().state == "success"
    portal_server.set_records(records[:6])              # 4 of 10 gone: over the 20% guard

    caplog.set_level(logging.INFO)
    assert harvest.run(full_sync=True).state == "success"
    run_id, status, stats, _ = last_run(db)
    assert (status, stats["removed"], stats["removals_withheld"]) == ("committed", 0, 4)
    (body,) = receiver.bodies(f"/hooks/{TOKEN}")
    assert (body["outcome"], body["run_id"], body["counts"]["removals_withheld"]) == ("degraded", run_id, 4)
    assert "4 removals withheld" in body["message"]

    extras = [extra for _, extra in asset_events()]
    assert extras[-1] == {"run_id": run_id, "created": 0, "updated": 0, "removed": 0, "review": 0,
                          "skipped": 0, "removals_withheld": 4}
    assert extras[-2]["created"] == len(records) and extras[-2]["removals_withheld"] == 0
    assert any(f"webhook http://127.0.0.1:{receiver._server.server_address[1]}/…" in r.getMessage()
               for r in caplog.records)
    assert TOKEN not in caplog.text and TOKEN not in "".join(capsys.readouterr())


def test_embeddings_skipped_while_the_breaker_is_open_are_degraded(harvest, portal_server, db, samples, gemini,
                                                                    receiver, monkeypatch):
    monkeypatch.setenv("CB_FAILURE_THRESHOLD", "2")
    records = samples(BIRMINGHAM)
    portal_server.set_records(records)
    harvest.configure(portal_server.base_url, notify=[{"webhook": receiver.base_url, "on": ["degraded"]}])
    gemini.fail_next(10_000, status=429, retry_after=0)     # an outage: the breaker opens
    assert harvest.run().state == "success"
    run_id, status, stats, _ = last_run(db)
    assert (status, stats["created"], stats["skipped"]) == ("committed", len(records), len(records))
    (body,) = receiver.bodies()
    assert (body["outcome"], body["run_id"], body["counts"]["skipped"]) == ("degraded", run_id, len(records))
    assert "without vectors" in body["message"]
    assert asset_events()[-1][1]["skipped"] == len(records)


def test_a_failed_run_is_announced(harvest, portal_server, db, samples, receiver):
    portal_server.set_records(samples(BIRMINGHAM))
    portal_server.fail_actions = {"package_search": 500}
    harvest.configure(portal_server.base_url, max_retries=1,
                      notify=[{"webhook": receiver.base_url + "/failed", "on": ["failed"]},
                              {"webhook": receiver.base_url + "/review", "on": ["review"]},
                              {"class": "harvester.testing.notifier.RecordingNotifier", "on": ["failed"],
                               "kwargs": {"url": receiver.base_url + "/class",
                                          "message": "{{ harvester.outcome }} in {{ dag.dag_id }}"}}])
    dag_run = harvest.run()
    assert dag_run.state == "failed"
    run_id, status, _, error = last_run(db)
    assert status == "failed" and "PortalUnavailable" in error
    assert sorted(path for path, _, _ in receiver.requests) == ["/class", "/failed"]
    (body,) = receiver.bodies("/failed")
    assert (body["outcome"], body["run_id"], body["dag_run_id"]) == ("failed", run_id, dag_run.run_id)
    assert "PortalUnavailable" in body["error"] and body["url"].endswith(quote(dag_run.run_id, safe=""))
    assert receiver.bodies("/class")[0]["message"] == "failed in harvest_test"


def test_failed_records_make_a_run_degraded_and_the_notice_carries_the_reasons_and_the_run_page(
        harvest, portal_server, db, samples, receiver, monkeypatch):
    monkeypatch.setenv("AIRFLOW__API__BASE_URL", "https://airflow.example.org/")
    records = samples(BIRMINGHAM)
    no_id = {k: v for k, v in records[0].items() if k != "id"}
    bad_dates = [{**r, "id": f"bad-{i}", "name": f"bad-{i}", "metadata_modified": "31/02/2020"}
                 for i, r in enumerate(records[1:3])]
    portal_server.set_records(records + [no_id] + bad_dates)
    harvest.configure(portal_server.base_url, notify=[{"webhook": receiver.base_url, "on": ["degraded", "failed"]}])
    assert harvest.run().state == "success"
    run_id, status, stats, _ = last_run(db)
    assert (status, stats["failed"], stats["created"]) == ("committed", 3, len(records))
    (body,) = receiver.bodies()
    assert (body["outcome"], body["run_id"], body["counts"]["failed"]) == ("degraded", run_id, 3)
    assert body["reasons"] == {"bad-date": 2, "no-identifier": 1}
    assert body["report_url"] == f"https://airflow.example.org/harvester/runs/{run_id}"
    assert "3 records failed (2 bad-date, 1 no-identifier)" in body["message"]


def test_a_catalogue_whose_records_all_fail_is_a_failed_run_announced_with_its_reasons(
        harvest, portal_server, db, samples, receiver):
    portal_server.set_records([{k: v for k, v in r.items() if k != "id"} for r in samples(BIRMINGHAM)])
    harvest.configure(portal_server.base_url, notify=[{"webhook": receiver.base_url, "on": ["failed"]}])
    dag_run = harvest.run()
    assert dag_run.state == "failed"
    run_id, status, _, error = last_run(db)
    assert status == "failed" and "all 10 records test listed failed (10 no-identifier)" in error
    assert db.execute("SELECT count(*) FROM record_outcomes WHERE run_id = %s", (run_id,)).fetchone()[0] == 10
    assert db.execute("SELECT count(*) FROM datasets").fetchone()[0] == 0
    (body,) = receiver.bodies()
    assert (body["outcome"], body["run_id"], body["reasons"]) == ("failed", run_id, {"no-identifier": 10})
    assert body["report_url"].endswith(f"/harvester/runs/{run_id}")
    # Terminal: the catalogue would fail the same way again, so the task was not retried.
    from airflow.models import TaskInstance
    from airflow.utils.session import create_session

    with create_session() as session:
        tries = session.query(TaskInstance.try_number).filter(
            TaskInstance.run_id == dag_run.run_id, TaskInstance.task_id == "fetch_modified").scalar()
    assert tries == 1


def test_a_receiver_that_is_down_does_not_fail_the_run_nor_stop_the_others(
        harvest, portal_server, db, samples, receiver, caplog):
    records = samples(BIRMINGHAM)
    portal_server.set_records(records)
    down = f"http://127.0.0.1:{closed_port()}/hooks/{TOKEN}"
    harvest.configure(portal_server.base_url, significance={"review_threshold": 0.3}, notify=[
        {"webhook": down, "timeout": 2},
        {"webhook": receiver.base_url + "/erroring"},
        {"webhook": receiver.base_url + "/ok"}])
    assert harvest.run().state == "success"
    portal_server.upsert_record(edited(records[0], title="Retitled"))
    receiver.statuses["/erroring"] = 500
    caplog.set_level(logging.WARNING)
    assert harvest.run().state == "success"
    assert last_run(db)[1] == "committed"
    assert [path for path, _, _ in receiver.requests] == ["/erroring", "/ok"]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING
                and "could not notify" in r.getMessage()]
    assert len(warnings) == 2
    assert any("could not be reached" in w for w in warnings) and any("HTTP 500" in w for w in warnings)
    assert TOKEN not in caplog.text


def test_a_notifier_class_by_import_path_gets_the_task_context_and_the_payload(
        harvest, portal_server, db, samples, receiver):
    records = samples(BIRMINGHAM)
    portal_server.set_records(records)
    harvest.configure(portal_server.base_url, significance={"review_threshold": 0.3}, notify=[{
        "class": "harvester.testing.notifier.RecordingNotifier", "on": ["review"],
        "kwargs": {"url": receiver.base_url + "/class",
                   "message": "{{ harvester.portal }}: {{ harvester.outcome }} in {{ dag.dag_id }}, "
                              "{{ harvester.counts.review }} to review"}}])
    assert harvest.run().state == "success"
    assert receiver.requests == []
    portal_server.upsert_record(edited(records[1], title="Retitled"))
    assert harvest.run().state == "success"
    (body,) = receiver.bodies("/class")
    assert body["message"] == "test: review in harvest_test, 1 to review"
    assert body["dag_id"] == "harvest_test" and body["has_task_context"] is True
    assert body["harvester"]["run_id"] == last_run(db)[0]


def test_the_consumer_does_nothing_on_an_event_with_no_change_and_no_review(
        harvest, portal_server, db, samples, monkeypatch, caplog):
    from airflow.dag_processing.dagbag import DagBag
    from airflow.models import dagrun as dagrun_module
    from airflow.models.asset import AssetEvent

    portal_server.set_records(samples(BIRMINGHAM))
    harvest.configure(portal_server.base_url)
    assert harvest.run().state == "success"
    assert harvest.run().state == "success"           # nothing changed
    event_id, extra = asset_events()[-1]
    assert extra == {"run_id": last_run(db)[0], "created": 0, "updated": 0, "removed": 0, "review": 0,
                     "skipped": 0, "removals_withheld": 0}

    # The consumer's DAG run is triggered by that event, as the scheduler would trigger it.
    create = dagrun_module.get_or_create_dagrun

    def triggered_by_the_event(**kwargs):
        dag_run = create(**kwargs)
        session = kwargs["session"]
        dag_run.consumed_asset_events.append(session.get(AssetEvent, event_id))
        session.commit()
        return dag_run

    monkeypatch.setattr(dagrun_module, "get_or_create_dagrun", triggered_by_the_event)
    bag = DagBag(dag_folder=str(ROOT / "dags" / "review_changes.py"))
    assert not bag.import_errors, bag.import_errors
    caplog.set_level(logging.INFO, logger="harvester.pipeline.review")
    dag_run = bag.get_dag("review_changes").test(logical_date=datetime.now(timezone.utc))
    assert dag_run.state == "success"
    messages = [r.getMessage() for r in caplog.records if r.name == "harvester.pipeline.review"]
    assert messages == [f"nothing to do: harvest runs [{extra['run_id']}] changed nothing and have nothing to review"]


# -- portals.yaml's notify: -----------------------------------------------------------------------
def parse(entry_notify, tmp_path, monkeypatch):
    from harvester.config.portals import load_portals

    path = tmp_path / "portals.yaml"
    path.write_text(yaml.safe_dump({"portals": [{"name": "x", "url": "https://x.org", "notify": entry_notify}]}))
    return load_portals(path)[0]


@pytest.mark.parametrize("notify, problem", [
    ({"webhook": "https://h.example"}, "notify must be a list of entries"),
    (["https://h.example"], "notify[0]: must be a mapping with webhook or class, got str"),
    ([{"webhook": "https://h.example", "class": "x.Y"}], "notify[0]: needs exactly one of webhook"),
    ([{"on": ["failed"]}], "notify[0]: needs exactly one of webhook"),
    ([{"webhook": "https://h.example", "when": ["failed"]}], "notify[0]: unknown key(s) when; valid keys are"),
    ([{"webhook": "https://h.example"}, {"webhook": "https://h.example", "on": ["broken"]}],
     "notify[1]: on ['broken'] must be a list of: failed, degraded, review"),
    ([{"webhook": "ftp://h.example/x"}], "notify[0]: webhook ftp://h.example/… must be an http(s) URL"),
    ([{"webhook": "https://h.example/${NOT_SET_ANYWHERE_42}"}],
     "notify[0]: webhook: environment variable NOT_SET_ANYWHERE_42 is not set"),
    ([{"webhook": "https://h.example", "timeout": 0}], "notify[0]: timeout 0 must be a number of seconds > 0"),
    ([{"class": "no_such_module_42.Notifier"}], "notify[0]: class 'no_such_module_42.Notifier' cannot be imported"),
    ([{"class": "harvester.config.portals.Portal"}], "notify[0]: class 'harvester.config.portals.Portal' is not an Airflow notifier"),
    ([{"class": "harvester.testing.notifier.RecordingNotifier", "kwargs": {"urll": "http://x"}}],
     "notify[0]: kwargs do not fit harvester.testing.notifier.RecordingNotifier"),
])
def test_a_bad_notify_entry_names_the_portal_and_the_entry(notify, problem, tmp_path, monkeypatch):
    from harvester.config.portals import PortalConfigError

    with pytest.raises(PortalConfigError) as err:
        parse(notify, tmp_path, monkeypatch)
    assert f"portals[0] (x): {problem}" in str(err.value)


def test_notify_entries_parse_with_yaml_s_bare_on_and_never_show_a_secret(tmp_path, monkeypatch):
    from harvester.config.portals import load_portals
    from harvester.pipeline.notify import notifier

    monkeypatch.setenv("HOOK_TOKEN", TOKEN)
    path = tmp_path / "portals.yaml"
    path.write_text(
        "portals:\n"
        "  - name: x\n"
        "    url: https://x.org\n"
        "    notify:\n"
        "      - webhook: https://hooks.example.org/services/${HOOK_TOKEN}\n"
        "        on: [failed, degraded]\n"                       # YAML 1.1 reads a bare on: as true
        "      - class: harvester.testing.notifier.RecordingNotifier\n"
        "        kwargs: {url: 'http://127.0.0.1:9/x'}\n")
    portal = load_portals(path)[0]
    webhook, cls = portal.notify
    assert webhook.on == {"failed", "degraded"} and cls.on == {"failed", "degraded", "review"}
    assert webhook.label == "webhook https://hooks.example.org/…" and cls.label == "harvester.testing.notifier.RecordingNotifier"
    assert TOKEN not in repr(portal) and TOKEN not in repr(notifier(webhook))
    assert notifier(webhook).url == f"https://hooks.example.org/services/{TOKEN}"
    hash(portal)
