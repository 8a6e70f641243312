"""Shared fixtures: a real embedded PostgreSQL with pgvector, one fresh database per test, the real
Airflow metadata DB for dag.test(), and the local CKAN portal over real HTTP on 127.0.0.1."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = Path(os.environ.get("HARVESTER_SAMPLES_DIR") or ROOT.parent / "shared" / "ckan-samples")

# Airflow reads its configuration when first imported: set it up before anything imports it.
_AIRFLOW_HOME = tempfile.mkdtemp(prefix="harvester-airflow-")
os.environ.update({
    "AIRFLOW_HOME": _AIRFLOW_HOME,
    "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
    "AIRFLOW__CORE__PLUGINS_FOLDER": str(ROOT / "plugins"),
    "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
    "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
    "HARVESTER_TASK_RETRIES": "0",
    "HF_HUB_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
})
os.environ.pop("HARVESTER_DATABASE_URL", None)
os.environ.pop("AIRFLOW_CONN_HARVESTER_DB", None)
sys.path.insert(0, str(ROOT / "plugins"))
import airflow  # noqa: E402,F401  initialized here, once, with the settings above


def load_samples(name: str) -> list[dict]:
    path = SAMPLES / name
    if not path.exists():
        pytest.fail(f"sample file {path} is missing: tests read ../shared/ckan-samples (or $HARVESTER_SAMPLES_DIR)")
    with path.open(encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


@pytest.fixture(scope="session")
def samples():
    return load_samples


# -- PostgreSQL ---------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def pg_server():
    from harvester.store.embedded.server import EmbeddedServer

    home = Path(tempfile.mkdtemp(prefix="harvester-pg-"))
    server = EmbeddedServer(home)
    server.start()
    yield server
    server.stop()
    shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="session")
def template_db(pg_server):
    """A migrated database every test's database is copied from."""
    import psycopg

    from harvester.store.migrations import migrate

    with psycopg.connect(pg_server.url("postgres"), autocommit=True) as conn:
        conn.execute("CREATE DATABASE harvester_template")
    with psycopg.connect(pg_server.url("harvester_template"), autocommit=True) as conn:
        migrate(conn)
    return "harvester_template"


@pytest.fixture
def database_url(pg_server, template_db, monkeypatch):
    """A fresh, migrated database for this test, configured for the CLI and for Airflow."""
    import psycopg

    name = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_server.url("postgres"), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template_db}"')
    url = pg_server.url(name)
    monkeypatch.setenv("HARVESTER_DATABASE_URL", url)
    monkeypatch.setenv("AIRFLOW_CONN_HARVESTER_DB", url)
    yield url
    with psycopg.connect(pg_server.url("postgres"), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def db(database_url):
    from harvester.store import db as store_db

    conn = store_db.prepare(store_db.connect_url(database_url))
    yield conn
    conn.close()


# -- the CKAN portal ----------------------------------------------------------------------------
@pytest.fixture
def portal_server():
    """A local CKAN portal; tests load records into it."""
    from harvester.testing.ckan_portal import DemoPortal

    server = DemoPortal(records=[])
    server.start()
    yield server
    server.stop()


# -- the Gemini API ---------------------------------------------------------------------------------
GEMINI_KEY = "AIza-test-key-for-harvester"


@pytest.fixture
def gemini(monkeypatch):
    """A local Gemini-protocol server, configured as the embedding provider (no retry delay)."""
    from harvester.testing.gemini import FakeGemini

    with FakeGemini(valid_keys={GEMINI_KEY}) as fake:
        monkeypatch.setenv("HARVESTER_EMBEDDING_PROVIDER", "gemini")
        monkeypatch.setenv("GEMINI_API_KEY", GEMINI_KEY)
        monkeypatch.setenv("GEMINI_BASE_URL", fake.base_url)
        monkeypatch.setenv("HARVESTER_EMBED_RETRY_DELAY_SECS", "0")
        monkeypatch.delenv("AIRFLOW_CONN_GEMINI_DEFAULT", raising=False)
        yield fake


# -- Airflow ------------------------------------------------------------------------------------
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


@pytest.fixture(scope="session")
def airflow_db():
    from airflow.utils import db as airflow_db_utils

    airflow_db_utils.resetdb()
    yield


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


@pytest.fixture
def harvest(airflow_db, database_url, tmp_path, monkeypatch):
    return Harvest(tmp_path, monkeypatch)
