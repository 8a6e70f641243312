"""Driving the harvest DAGs through real Airflow in one process (``dag.test()``), as the tests do:
a portals.yaml for one portal, a DAG run, the operator's clear-and-resume, and a secrets backend
swapped in for a block. Whatever is about scheduling, pools or crashes runs under a real scheduler
instead (``harvester.testing.airflow_cluster``)."""
from __future__ import annotations

import contextlib
from pathlib import Path

from harvester.testing.samples import ROOT


@contextlib.contextmanager
def secrets_backend(monkeypatch, path: str):
    """Airflow's secrets backend is the class at ``path`` (module.Class) inside the block."""
    from airflow.sdk.configuration import clear_secrets_backends_cache

    monkeypatch.setenv("AIRFLOW__SECRETS__BACKEND", path)
    clear_secrets_backends_cache()
    try:
        yield
    finally:
        monkeypatch.delenv("AIRFLOW__SECRETS__BACKEND")
        clear_secrets_backends_cache()



class Harvest:
    """Runs harvest_<name> through real Airflow (dag.test()) against a portal URL."""

    def __init__(self, tmp_path: Path, monkeypatch, name: str = "test"):
        self.tmp_path, self.monkeypatch, self.name = tmp_path, monkeypatch, name

    def configure(self, url: str, **extra) -> Path:
        import yaml

        entry = {"name": self.name, "url": url, "schedule": None, "enabled": True, "page_size": 100,
                 "politeness_delay": 0, "lookback": "1h", **extra}
        path = self.tmp_path / "portals.yaml"
        path.write_text(yaml.safe_dump({"portals": [entry]}))
        self.monkeypatch.setenv("HARVESTER_PORTALS_FILE", str(path))
        return path

    def dag(self):
        from airflow.dag_processing.dagbag import DagBag

        bag = DagBag(dag_folder=str(ROOT / "dags" / "harvest_portals.py"))
        assert not bag.import_errors, bag.import_errors
        return bag.get_dag(f"harvest_{self.name}")

    def run(self, full_sync: bool = False, **conf):
        from datetime import datetime, timezone

        dag = self.dag()
        return dag.test(logical_date=datetime.now(timezone.utc), run_conf={"full_sync": full_sync, **conf})

    def clear(self, dag_run, task_id: str | None = None) -> None:
        """What an operator does after fixing a failure: `airflow tasks clear` of the failed task with
        its downstream tasks (``-t task -d``), or of the whole DAG run (no task_id), through
        Airflow's own CLI command. (Airflow 3.3 matches ``-t`` as a substring of task ids.)"""
        from airflow.cli import cli_parser

        when = dag_run.logical_date.isoformat()
        argv = ["tasks", "clear", dag_run.dag_id, "-s", when, "-e", when, "-y"]
        if task_id:
            argv += ["-t", task_id, "-d"]
        args = cli_parser.get_parser().parse_args(argv)
        args.func(args)

    def resume(self, dag_run):
        """Run a cleared DAG run to its end as the scheduler would: only the cleared tasks run, the
        others keep their state and XComs (dag.test() would start the whole DAG run over)."""
        import time

        from airflow import settings
        from airflow.models.dagrun import DagRun
        from airflow.sdk.definitions.dag import _run_task
        from airflow.serialization.serialized_objects import DagSerialization
        from airflow.utils.state import DagRunState, TaskInstanceState
        from sqlalchemy import select

        dag = self.dag()
        scheduler_dag = DagSerialization.deserialize_dag(DagSerialization.serialize_dag(dag))
        scheduler_dag.on_failure_callback = dag.on_failure_callback
        scheduler_dag.on_success_callback = dag.on_success_callback
        session = settings.Session()
        dr = session.scalar(select(DagRun).where(DagRun.dag_id == dag.dag_id, DagRun.run_id == dag_run.run_id))
        dr.dag = scheduler_dag
        dr.state = DagRunState.RUNNING
        session.commit()
        deadline = time.monotonic() + 600
        while dr.state == DagRunState.RUNNING and time.monotonic() < deadline:
            session.expire_all()
            schedulable, _ = dr.update_state(session=session)
            for ti in schedulable:
                ti.try_number += 1
                ti.state = TaskInstanceState.SCHEDULED
            session.commit()
            for ti in [t for t in dr.get_task_instances(session=session) if t.state == TaskInstanceState.SCHEDULED]:
                try:
                    _run_task(ti=ti, task=dag.task_dict[ti.task_id])
                except Exception:  # the task's failure is recorded on its instance, as in dag.test()
                    pass
        session.expire_all()
        return dr

    def task_states(self, dag_run) -> dict:
        return {(ti.task_id, ti.map_index): str(getattr(ti.state, "value", ti.state))
                for ti in dag_run.get_task_instances()}
