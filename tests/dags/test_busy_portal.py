"""Many portals, one Airflow (issue 21). begin waits for a busy portal as a sensor in reschedule mode
(no worker slot held, nothing failed) for at most HARVESTER_BUSY_WAIT_SECS, then fails naming the
run that holds it; a backfill is one full sync, its other DAG runs covered and successful; every
task checks that the run it was handed is its portal's and its DAG run's; a task never falls back to
the embedded database under an executor that runs tasks on other machines; the settings the DAG
file reads are named when bad. Through real Airflow (dag.test(), and Airflow's own backfill
creation driven as its scheduler would), against a real PostgreSQL."""
from __future__ import annotations

import logging
import os
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import psycopg
import pytest
from airflow.secrets import BaseSecretsBackend

from harvester.config.settings import task_settings
from harvester.domain.run import BackfillRun, Cover, TaskSettings, cover_backfill
from harvester.store import db as store_db
from harvester.store import runs as store_runs

ROOT = Path(__file__).resolve().parents[2]
BIRMINGHAM = "data-birmingham-gov-uk.jsonl"
NOW = datetime(2026, 11, 24, 12, 0, tzinfo=timezone.utc)
OTHER = "backfill__2026-11-01T00:00:00+00:00"


# -- the rule: one full sync per backfill ---------------------------------------------------------
def backfill_run(status: str, *, dag_run_id: str = OTHER, idle: timedelta = timedelta(minutes=1),
                 finished_ago: timedelta | None = None) -> BackfillRun:
    return BackfillRun(7, dag_run_id, status, NOW - timedelta(hours=3), NOW - idle,
                       NOW - finished_ago if finished_ago is not None else None)


def cover(last, *, takeover=False, window=timedelta(hours=12)) -> Cover:
    return cover_backfill(last, dag_run_id="backfill__2026-11-02T00:00:00+00:00", takeover=takeover, window=window,
                          stale_after=timedelta(hours=2), now=NOW, portal="p")


def test_a_backfill_dag_run_waits_for_the_backfill_full_sync_under_way_then_is_covered_by_it():
    waiting = cover(backfill_run("running"))
    assert (waiting.action, waiting.run_id) == ("wait", 7)
    assert waiting.reason == ("p is being synced in full for this backfill by run 7 (a full sync started 2026-11-24 "
                              f"09:00:00 UTC by DAG run {OTHER}), last progress 1m ago: this backfill DAG run waits "
                              "for it instead of syncing the portal again")
    covered = cover(backfill_run("committed", finished_ago=timedelta(hours=1)))
    assert (covered.action, covered.run_id) == ("covered", 7)
    assert "committed 1h ago (HARVESTER_BACKFILL_COVER_SECS 12h)" in covered.reason


@pytest.mark.parametrize("last, kwargs, why", [
    (None, {}, "no backfill DAG run synced p yet"),
    (backfill_run("running", idle=timedelta(hours=3)), {}, "made no progress for 3h (stale_after 2h)"),
    (backfill_run("running", dag_run_id="backfill__2026-11-02T00:00:00+00:00"), {}, "is this DAG run's own"),
    (backfill_run("committed", finished_ago=timedelta(hours=13)), {}, "committed 13h ago (HARVESTER_BACKFILL_COVER_SECS 12h)"),
    (backfill_run("failed"), {}, "is failed: this backfill DAG run syncs it itself"),
    (backfill_run("abandoned"), {}, "is abandoned"),
    (backfill_run("running"), {"takeover": True}, "takeover was requested"),
    (backfill_run("committed", finished_ago=timedelta(minutes=5)), {"window": timedelta(0)},
     "HARVESTER_BACKFILL_COVER_SECS is 0"),
], ids=["none-yet", "stale", "its-own", "too-old", "failed", "abandoned", "takeover", "window-0"])
def test_a_backfill_dag_run_syncs_the_portal_itself_when_nothing_covers_it(last, kwargs, why):
    decision = cover(last, **kwargs)
    assert decision.action == "run" and why in decision.reason, decision


# -- the settings the DAG file reads --------------------------------------------------------------
def test_settings_defaults_and_values():
    assert task_settings({}) == TaskSettings()
    assert TaskSettings().busy_wait == timedelta(hours=6) and TaskSettings().embedding_pool == "default_pool"
    got = task_settings({"HARVESTER_TASK_RETRIES": "0", "HARVESTER_TASK_RETRY_DELAY_SECS": " 5 ",
                                 "HARVESTER_BUSY_POLL_SECS": "2", "HARVESTER_BUSY_WAIT_SECS": "10",
                                 "HARVESTER_BACKFILL_COVER_SECS": "0", "HARVESTER_EMBEDDING_POOL": "embedding_api"})
    assert got == TaskSettings(0, timedelta(seconds=5), timedelta(seconds=2), timedelta(seconds=10), timedelta(0),
                               "embedding_api")
    assert task_settings({"HARVESTER_EMBEDDING_POOL": " "}).embedding_pool == "default_pool"


@pytest.mark.parametrize("env, message", [
    ({"HARVESTER_TASK_RETRIES": "three"}, "HARVESTER_TASK_RETRIES='three' must be a whole number from 0 to 100"),
    ({"HARVESTER_TASK_RETRY_DELAY_SECS": "-1"},
     "HARVESTER_TASK_RETRY_DELAY_SECS='-1' must be a whole number from 0 to 86400"),
    ({"HARVESTER_BUSY_POLL_SECS": "0"}, "HARVESTER_BUSY_POLL_SECS='0' must be a whole number from 1 to 3600"),
    ({"HARVESTER_BUSY_WAIT_SECS": "43200"}, "HARVESTER_BUSY_WAIT_SECS='43200' must be a whole number from 1 to 43199"),
    ({"HARVESTER_BUSY_POLL_SECS": "60", "HARVESTER_BUSY_WAIT_SECS": "30"},
     "HARVESTER_BUSY_WAIT_SECS=30 must be at least HARVESTER_BUSY_POLL_SECS=60"),
    ({"HARVESTER_BACKFILL_COVER_SECS": "1.5"},
     "HARVESTER_BACKFILL_COVER_SECS='1.5' must be a whole number from 0 to 2592000"),
])
def test_a_bad_setting_is_named(env, message):
    with pytest.raises(ValueError) as caught:
        task_settings(env)
    assert message in str(caught.value)


def test_a_bad_setting_is_an_import_error_of_the_dag_file_naming_it(airflow_db, monkeypatch, tmp_path):
    from airflow.dag_processing.dagbag import DagBag

    (tmp_path / "portals.yaml").write_text("portals:\n  - {name: a, url: 'https://a.example.org'}\n")
    monkeypatch.setenv("HARVESTER_PORTALS_FILE", str(tmp_path / "portals.yaml"))
    monkeypatch.setenv("HARVESTER_TASK_RETRIES", "3x")
    bag = DagBag(dag_folder=str(ROOT / "dags" / "harvest_portals.py"))
    (error,) = bag.import_errors.values()
    assert "HARVESTER_TASK_RETRIES='3x' must be a whole number from 0 to 100" in error
    monkeypatch.setenv("HARVESTER_TASK_RETRIES", "1")
    monkeypatch.setenv("HARVESTER_EMBEDDING_POOL", "embedding_api")
    bag = DagBag(dag_folder=str(ROOT / "dags" / "harvest_portals.py"))
    assert not bag.import_errors
    assert bag.get_dag("harvest_a").get_task("embed_changed").pool == "embedding_api"


# -- each task checks its run is its portal's and its DAG run's -----------------------------------
def test_a_run_of_another_portal_or_dag_run_or_database_is_refused(db):
    a = store_runs.start(db, portal_url="https://a.org", portal_name="a", dag_run_id="manual__a", mode="full",
                         since=None)
    b = store_runs.start(db, portal_url="https://b.org", portal_name="b", dag_run_id="manual__b", mode="full",
                         since=None)
    cli = store_runs.start(db, portal_url="https://c.org", portal_name="c", dag_run_id=None, mode="full", since=None)
    store_runs.require_own(db, a.run_id, "https://a.org", "manual__a")
    store_runs.require_own(db, b.run_id, "https://b.org", "manual__b")
    store_runs.require_own(db, cli.run_id, "https://c.org", None)
    where = f"{db.info.host}:{db.info.port}/{db.info.dbname}"
    tail = ("this worker probably reaches another database than the one begin used. The Airflow connection "
            "harvester_db must point at the same database on every worker.")
    cases = [
        ((a.run_id, "https://b.org", "manual__b"),
         f"run {a.run_id} belongs to portal a (https://a.org), not to https://b.org (in the harvester database {where}): "),
        ((a.run_id, "https://a.org", "manual__b"),
         f"run {a.run_id} of a belongs to DAG run manual__a, not to DAG run manual__b (in the harvester database "
         f"{where}): "),
        ((cli.run_id, "https://c.org", "manual__c"),
         f"run {cli.run_id} of c belongs to a CLI run (harvester harvest), not to DAG run manual__c"),
        ((cli.run_id + 100, "https://c.org", "manual__c"),
         f"run {cli.run_id + 100} is not in the harvester database {where}: "),
    ]
    for args, message in cases:
        with pytest.raises(store_runs.RunMismatch) as caught:
            store_runs.require_own(db, *args)
        assert message in str(caught.value) and str(caught.value).endswith(tail), str(caught.value)
        assert isinstance(caught.value, store_runs.NotResumable)  # tasks fail at once, without retries


class SplitBrain(BaseSecretsBackend):
    """Secrets backend of two workers that disagree: begin's harvester_db is one database, every other
    task's another (URLS[task_id == "begin"])."""

    URLS: dict[bool, str] = {}

    def get_conn_value(self, conn_id: str, team_name: str | None = None) -> str | None:
        if conn_id != "harvester_db":
            return None
        from airflow.sdk import get_current_context

        try:
            task_id = get_current_context()["ti"].task_id
        except Exception:  # a DAG callback: no task running
            task_id = None
        return self.URLS[task_id == "begin"]


def test_a_task_whose_worker_reaches_another_database_fails_at_once_naming_it(
        harvest, portal_server, db, database_url, pg_server, template_db, samples, monkeypatch, capfd, caplog):
    from harvester.testing.dagtest import secrets_backend

    portal_server.set_records(samples(BIRMINGHAM)[:5])
    harvest.configure(portal_server.base_url)
    monkeypatch.setenv("HARVESTER_TASK_RETRIES", "1")
    monkeypatch.setenv("HARVESTER_TASK_RETRY_DELAY_SECS", "0")
    name = f"other_{int(time.time() * 1000)}"
    with psycopg.connect(pg_server.url("postgres"), autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template_db}"')
    other = pg_server.url(name)
    try:
        with store_db.prepare(store_db.connect_url(other)) as conn:  # its run 1 is another portal's
            store_runs.start(conn, portal_url="https://other.example.org", portal_name="other",
                             dag_run_id="manual__other", mode="full", since=None)
        SplitBrain.URLS = {True: database_url, False: other}
        monkeypatch.delenv("AIRFLOW_CONN_HARVESTER_DB")
        with secrets_backend(monkeypatch, f"{__name__}.SplitBrain"):
            dag_run = harvest.run()
        states = {ti.task_id: (str(ti.state), ti.try_number) for ti in dag_run.get_task_instances()}
        assert dag_run.state == "failed"
        assert states["begin"] == ("success", 1) and states["fetch_modified"] == ("failed", 1)  # no retry
        out = capfd.readouterr()
        said = out.out + out.err + caplog.text
        assert (f"AirflowFailException: run 1 belongs to portal other (https://other.example.org), not to "
                f"{portal_server.base_url} (in the harvester database 127.0.0.1:{other.rsplit(':', 1)[1].split('/')[0]}/{name}): this worker "
                "probably reaches another database than the one begin used.") in said, said[-3000:]
        with psycopg.connect(other) as conn:  # nothing touched there
            assert conn.execute("SELECT status, stats->>'fetched' FROM sync_runs").fetchall() == [("running", "0")]
    finally:
        with psycopg.connect(pg_server.url("postgres"), autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# -- the embedded database and the executor -------------------------------------------------------
@pytest.mark.parametrize("setting, refused", [
    ("LocalExecutor", []),
    ("airflow.executors.local_executor.LocalExecutor", []),
    ("SequentialExecutor", []),
    ("CeleryExecutor", ["CeleryExecutor"]),
    ("LocalExecutor, airflow.providers.cncf.kubernetes.executors.kubernetes_executor.KubernetesExecutor",
     ["KubernetesExecutor"]),
    ("edge:airflow.providers.edge3.executors.EdgeExecutor", ["EdgeExecutor"]),
    ("=LocalExecutor;team_a=CeleryExecutor", ["CeleryExecutor"]),
])
def test_which_executors_run_tasks_on_other_machines(setting, refused):
    assert store_db.distributed_executors(setting) == refused


def test_a_task_refuses_the_embedded_database_on_a_distributed_executor_and_the_cli_does_not(
        pg_server, monkeypatch, tmp_path):
    monkeypatch.delenv("AIRFLOW_CONN_HARVESTER_DB", raising=False)
    monkeypatch.delenv("HARVESTER_DATABASE_URL", raising=False)
    monkeypatch.delenv("HARVESTER_EMBEDDED_DB", raising=False)
    monkeypatch.setenv("HARVESTER_HOME", str(tmp_path))
    monkeypatch.setenv("AIRFLOW__CORE__EXECUTOR", "CeleryExecutor")
    with pytest.raises(store_db.DatabaseConfigError) as caught:
        store_db.airflow_connection()
    assert str(caught.value) == (
        "no Airflow connection harvester_db is defined, and Airflow's executor ([core] executor / "
        "AIRFLOW__CORE__EXECUTOR: CeleryExecutor) runs tasks on other workers (CeleryExecutor): each worker would "
        "get an embedded PostgreSQL of its own. Define the Airflow connection harvester_db on every worker (e.g. "
        "AIRFLOW_CONN_HARVESTER_DB=postgresql://user:password@host:5432/harvester)")
    assert list(tmp_path.iterdir()) == []  # no embedded server was started

    # The CLI keeps its fallback; so does a task under LocalExecutor (the tests' own server, running).
    monkeypatch.setenv("HARVESTER_HOME", str(pg_server.home))
    assert store_db.cli_database_url() == pg_server.url()
    monkeypatch.setenv("AIRFLOW__CORE__EXECUTOR", "airflow.executors.local_executor.LocalExecutor")
    assert store_db._embedded_url("no Airflow connection harvester_db is defined", logging.WARNING,
                                  task=True) == pg_server.url()


# -- waiting for a busy portal, through Airflow ---------------------------------------------------
def task_instances(dag_run) -> dict:
    from airflow.models import TaskInstance
    from airflow.utils.session import create_session

    with create_session() as session:
        return {(ti.task_id, ti.map_index): (str(getattr(ti.state, "value", ti.state)), ti.try_number, ti.id)
                for ti in session.query(TaskInstance).filter(TaskInstance.dag_id == dag_run.dag_id,
                                                             TaskInstance.run_id == dag_run.run_id)}


def reschedules(dag_run, task_id: str = "begin") -> int:
    """How many times Airflow rescheduled the task (each one a poke that released its worker slot)."""
    from airflow.models.taskreschedule import TaskReschedule
    from airflow.utils.session import create_session

    ti_id = task_instances(dag_run)[(task_id, -1)][2]
    with create_session() as session:
        return session.query(TaskReschedule).filter(TaskReschedule.ti_id == ti_id).count()


def test_begin_waits_for_a_busy_portal_without_a_worker_slot_then_harvests(
        harvest, portal_server, db, database_url, samples, monkeypatch, capfd, caplog):
    portal_server.set_records(samples(BIRMINGHAM)[:5])
    harvest.configure(portal_server.base_url)
    monkeypatch.setenv("HARVESTER_BUSY_POLL_SECS", "1")
    monkeypatch.setenv("HARVESTER_BUSY_WAIT_SECS", "120")
    cli = store_runs.start(db, portal_url=portal_server.base_url, portal_name="test", dag_run_id=None,
                           mode="full", since=None)

    stop = threading.Event()

    def cli_run_ends_once_begin_waits():
        from airflow.models import TaskInstance
        from airflow.utils.session import create_session

        while not stop.wait(0.2):
            with create_session() as session:
                if session.query(TaskInstance).filter(TaskInstance.task_id == "begin",
                                                      TaskInstance.state == "up_for_reschedule").count():
                    break
        time.sleep(2)  # a few more busy pokes
        with psycopg.connect(database_url, autocommit=True) as conn:
            store_runs.abort(conn, cli.run_id, "cancelled", "the CLI run was interrupted (Ctrl-C)")

    release = threading.Thread(target=cli_run_ends_once_begin_waits)
    release.start()
    caplog.set_level(logging.INFO)
    try:
        dag_run = harvest.run()
    finally:
        stop.set()
        release.join()
    assert dag_run.state == "success"
    states = task_instances(dag_run)
    assert states[("begin", -1)][:2] == ("success", 1)  # never failed, never retried
    assert all(state in ("success",) for state, _, _ in states.values()), states
    assert reschedules(dag_run) >= 1  # each busy poke handed its worker slot back (UP_FOR_RESCHEDULE)
    out = capfd.readouterr()
    said = out.out + out.err + caplog.text
    assert (f"test is being harvested by run {cli.run_id} (started " in said
            and "the CLI (harvester harvest)), last progress" in said), said[-3000:]
    assert "Waiting for it: checked again in 1s, without holding a worker slot" in said
    assert "Task failed" not in said and "AirflowFailException" not in said
    assert db.execute("SELECT run_id, status FROM sync_runs ORDER BY run_id").fetchall() == [
        (cli.run_id, "cancelled"), (cli.run_id + 1, "committed")]


def test_begin_gives_up_after_the_wait_limit_naming_the_run_that_holds_the_portal(
        harvest, portal_server, db, samples, monkeypatch, capfd, caplog):
    portal_server.set_records(samples(BIRMINGHAM)[:5])
    harvest.configure(portal_server.base_url)
    monkeypatch.setenv("HARVESTER_TASK_RETRIES", "2")  # a retry would not help: there is none
    monkeypatch.setenv("HARVESTER_BUSY_POLL_SECS", "1")
    monkeypatch.setenv("HARVESTER_BUSY_WAIT_SECS", "4")
    holder = store_runs.start(db, portal_url=portal_server.base_url, portal_name="test",
                              dag_run_id="scheduled__2026-11-22T00:00:00+00:00", mode="full", since=None)
    dag_run = harvest.run()
    assert dag_run.state == "failed"
    assert task_instances(dag_run)[("begin", -1)][:2] == ("failed", 1)
    # it poked again and again without its slot: how many times in 4 s is the machine's speed (a poke
    # opens a connection and runs begin; 3 a second apart once read 2 on a loaded machine)
    assert reschedules(dag_run) >= 2
    out = capfd.readouterr()
    said = out.out + out.err + caplog.text
    failure = [line for line in said.splitlines() if "AirflowFailException" in line and "Gave up" in line]
    assert failure, said[-3000:]
    assert (f"test is being harvested by run {holder.run_id} (started " in failure[0]
            and "by DAG run scheduled__2026-11-22T00:00:00+00:00)" in failure[0]
            and "(HARVESTER_BUSY_WAIT_SECS 4)." in failure[0]), failure[0]
    assert store_runs.get(db, holder.run_id).status == "running"  # the holder goes on
    assert db.execute("SELECT count(*) FROM sync_runs").fetchone()[0] == 1


# -- a backfill, as Airflow creates it ------------------------------------------------------------
def sync_dags_to_the_metadata_db() -> None:
    """What dag.test() does first: the DAG files' DAGs serialized into Airflow's metadata database."""
    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.dag_processing.dagbag import BundleDagBag, sync_bag_to_db

    previous = os.environ.get("AIRFLOW__CORE__MIN_SERIALIZED_DAG_UPDATE_INTERVAL")
    os.environ["AIRFLOW__CORE__MIN_SERIALIZED_DAG_UPDATE_INTERVAL"] = "0"  # the DAG file as it is now
    try:
        manager = DagBundlesManager()
        manager.sync_bundles_to_db()
        for bundle in manager.get_all_dag_bundles():
            if not bundle.is_initialized:
                bundle.initialize()
            bag = BundleDagBag(dag_folder=bundle.path, bundle_path=bundle.path, bundle_name=bundle.name)
            assert not bag.import_errors, bag.import_errors
            sync_bag_to_db(bag, bundle.name, bundle.version)
    finally:
        if previous is None:
            os.environ.pop("AIRFLOW__CORE__MIN_SERIALIZED_DAG_UPDATE_INTERVAL")
        else:
            os.environ["AIRFLOW__CORE__MIN_SERIALIZED_DAG_UPDATE_INTERVAL"] = previous


def drive(dag, run_ids: list[str], timeout: float = 300):
    """Runs the DAG runs to their end as the scheduler would run a backfill's DAG runs at the same time:
    in turns, one task of each DAG run per turn, a sensor's reschedule honoured (as dag.test() does)."""
    from airflow import settings
    from airflow.models.dagrun import DagRun
    from airflow.sdk.definitions.dag import _run_task
    from airflow.serialization.serialized_objects import DagSerialization
    from airflow.utils.state import DagRunState, TaskInstanceState
    from sqlalchemy import select

    scheduler_dag = DagSerialization.deserialize_dag(DagSerialization.serialize_dag(dag))
    scheduler_dag.on_failure_callback = dag.on_failure_callback

    def dag_run(run_id):  # read again each time: running a task closes the session it was read in
        session = settings.Session()
        dr = session.scalar(select(DagRun).where(DagRun.dag_id == dag.dag_id, DagRun.run_id == run_id))
        dr.dag = scheduler_dag
        return session, dr

    for run_id in run_ids:
        session, dr = dag_run(run_id)
        dr.state = DagRunState.RUNNING
        session.commit()
    running = list(run_ids)
    deadline = time.monotonic() + timeout
    while running and time.monotonic() < deadline:
        ran = False
        for run_id in list(running):
            session, dr = dag_run(run_id)
            schedulable, _ = dr.update_state(session=session)
            for ti in schedulable:
                if ti.state != TaskInstanceState.UP_FOR_RESCHEDULE:
                    ti.try_number += 1
                ti.state = TaskInstanceState.SCHEDULED
            session.commit()
            if dr.state != DagRunState.RUNNING:
                running.remove(run_id)
                continue
            ready = [ti for ti in dr.get_task_instances(session=session) if ti.state == TaskInstanceState.SCHEDULED]
            if ready:
                ti = min(ready, key=lambda t: (t.task_id, t.map_index))
                try:
                    _run_task(ti=ti, task=dag.task_dict[ti.task_id])
                except Exception:  # recorded on the task instance
                    pass
                ran = True
        if not ran:
            time.sleep(0.3)
    return [dag_run(run_id)[1] for run_id in run_ids]


def asset_events(uri: str, run_ids: list[str]) -> list:
    """The DAG runs ``run_ids`` emitted for Asset ``uri``, as (DAG run id, extra)."""
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session

    with create_session() as session:
        return [(e.source_run_id, e.extra) for e in session.query(AssetEvent)
                .join(AssetModel, AssetEvent.asset_id == AssetModel.id)
                .filter(AssetModel.uri == uri, AssetEvent.source_run_id.in_(run_ids)).order_by(AssetEvent.id)]


def test_a_backfill_is_one_full_sync_and_its_other_dag_runs_succeed_covered_by_it(
        harvest, portal_server, db, samples, monkeypatch, capfd, caplog):
    from airflow.models.backfill import _create_backfill
    from airflow.models.dagrun import DagRun
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    records = samples(BIRMINGHAM)[:5]
    portal_server.set_records(records)
    harvest.configure(portal_server.base_url, schedule="@daily")
    monkeypatch.setenv("HARVESTER_BUSY_POLL_SECS", "1")
    caplog.set_level(logging.INFO)
    dag = harvest.dag()
    sync_dags_to_the_metadata_db()
    backfill = _create_backfill(dag_id=dag.dag_id, from_date=datetime(2026, 1, 1, tzinfo=timezone.utc),
                                to_date=datetime(2026, 1, 3, tzinfo=timezone.utc), max_active_runs=10, reverse=False,
                                dag_run_conf=None, triggering_user_name="test")
    with create_session() as session:
        run_ids = sorted(dr.run_id for dr in session.query(DagRun).filter(DagRun.backfill_id == backfill.id))
    assert len(run_ids) == 3 and all(r.startswith("backfill__") for r in run_ids)

    dag_runs = drive(dag, run_ids)
    assert [str(dr.state) for dr in dag_runs] == ["success"] * 3

    (run,) = db.execute("SELECT run_id, dag_run_id, mode, status, backfill, covered_dag_runs, stats->>'created'"
                        " FROM sync_runs").fetchall()
    run_id, synced_by, mode, status, backfill_flag, covered, created = run
    assert (mode, status, backfill_flag, int(created)) == ("full", "committed", True, len(records))
    assert synced_by == run_ids[0] and sorted(covered) == run_ids[1:]
    for dr in dag_runs[1:]:
        states = task_instances(dr)
        assert states.pop(("begin", -1))[0] == "success"
        assert {state for state, _, _ in states.values()} == {"skipped"}, states
        assert reschedules(dr) >= 1  # it waited for the full sync under way
        with create_session() as session:
            (value,) = [x.value for x in session.query(XComModel).filter(
                XComModel.dag_id == dag.dag_id, XComModel.run_id == dr.run_id, XComModel.task_id == "begin")]
        assert value == {"run_id": run_id, "covered": True, "covered_by": synced_by}
    # The full sync's Asset event, and none of the covered DAG runs.
    assert [(dag_run_id, extra["run_id"]) for dag_run_id, extra in asset_events("harvester://test/datasets", run_ids)
            ] == [(synced_by, run_id)]
    out = capfd.readouterr()
    said = out.out + out.err + caplog.text
    for dr in dag_runs[1:]:
        assert f"backfill DAG run {dr.run_id} is covered by run {run_id} (DAG run {synced_by})" in said, said[-3000:]
    assert "this backfill DAG run waits for it instead of syncing the portal again" in said
