"""Shared fixtures: a real embedded PostgreSQL with pgvector, one fresh database per test, the real
Airflow metadata DB for dag.test(), and the local CKAN portal over real HTTP on 127.0.0.1."""
from __future__ import annotations

import os
import shutil
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

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

from harvester.testing.dagtest import Harvest  # noqa: E402
from harvester.testing.gemini import TEST_KEY as GEMINI_KEY  # noqa: E402
from harvester.testing.samples import load_samples  # noqa: E402


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


@pytest.fixture
def reader(database_url):
    """A second connection: what a run's steps stream through while ``db`` writes."""
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
@pytest.fixture(scope="session")
def airflow_db():
    from airflow.utils import db as airflow_db_utils

    airflow_db_utils.resetdb()
    yield


@pytest.fixture
def harvest(airflow_db, database_url, tmp_path, monkeypatch):
    return Harvest(tmp_path, monkeypatch)
