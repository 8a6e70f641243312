"""Connections to the harvester database: which one, and opened ready for use.

DAG tasks use the Airflow connection ``harvester_db`` through PostgresHook. The CLI uses
HARVESTER_DATABASE_URL, else that same connection (AIRFLOW_CONN_HARVESTER_DB), else an embedded
server that already holds data (HARVESTER_HOME's, else `.harvester/`'s, else the demo's), never a
new empty one. The embedded PostgreSQL (store/server.py: a local server run with fsync off) is used only
when no ``harvester_db`` is defined at all (a task says so in a WARNING), never with
HARVESTER_EMBEDDED_DB=off, and never by a task under an executor that runs tasks on other machines
(Celery, Kubernetes, Edge: each worker would get its own). Any other problem with the connection fails, naming it and why:

* DatabaseConfigError: the configuration is wrong (a value that does not parse, not a PostgreSQL
  URI, not defined while the embedded server is off, a schema behind the code). Retrying cannot
  help: tasks fail at once, without retries.
* DatabaseLookupError: looking the connection up or connecting failed (a secrets backend raised,
  the server did not answer). That may pass: tasks fail and are retried.
"""
from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from urllib.parse import urlsplit

from harvester.config.secrets import (ConnectionLookupError, ConnectionValueError, lookup_connection,
                                      redact_connection, scrub_connection)
from harvester.config.secrets import conn_env as airflow_conn_env
from harvester.config.settings import SettingError, env_value
from harvester.store import migrations

log = logging.getLogger(__name__)

CONN_ID = "harvester_db"
URL_ENV = "HARVESTER_DATABASE_URL"
EMBEDDED_ENV = "HARVESTER_EMBEDDED_DB"
# What a PostgreSQL URI may start with (Airflow reads postgresql:// as connection type postgres).
POSTGRES_SCHEMES = ("postgresql", "postgres", "postgresql+psycopg", "postgresql+psycopg2")


class DatabaseConfigError(RuntimeError):
    """The database configuration is wrong; retrying cannot help."""

    transient = False


class DatabaseLookupError(RuntimeError):
    """Looking the database connection up, or connecting, failed; it may pass."""

    transient = True


def conn_env(conn_id: str = CONN_ID) -> str:
    """The environment variable that defines Airflow connection ``conn_id``."""
    return airflow_conn_env(conn_id)


def embedded_allowed() -> bool:
    """HARVESTER_EMBEDDED_DB: on (the default) or off (no fallback to the embedded server)."""
    try:
        return env_value(EMBEDDED_ENV)
    except SettingError as exc:
        raise DatabaseConfigError(str(exc)) from None


# Executors that run every task on this one machine: the only ones a task's embedded server suits.
SINGLE_MACHINE_EXECUTORS = ("LocalExecutor", "SequentialExecutor")


def distributed_executors(setting: str) -> list[str]:
    """The executors of Airflow's ``[core] executor`` setting (names, class paths, ``alias:path``,
    comma-separated, ``team=...;...`` lists) that may run tasks on other machines than this one."""
    found = []
    for team in setting.split(";"):
        for entry in team.rpartition("=")[2].split(","):
            name = entry.strip().rpartition(":")[2].rpartition(".")[2]
            if name and name not in SINGLE_MACHINE_EXECUTORS:
                found.append(name)
    return found


def _refuse_on_distributed_executor(why: str) -> None:
    """DatabaseConfigError when Airflow's executor may run a task on another machine: each worker
    would start an embedded database of its own, and the runs' tasks would not find each other's work."""
    from airflow.configuration import conf

    setting = conf.get("core", "executor", fallback="") or ""
    others = distributed_executors(setting)
    if others:
        raise DatabaseConfigError(
            f"{why}, and Airflow's executor ([core] executor / AIRFLOW__CORE__EXECUTOR: {setting}) runs tasks on "
            f"other workers ({', '.join(others)}): each worker would get an embedded PostgreSQL of its own. Define the "
            f"Airflow connection {CONN_ID} on every worker (e.g. {conn_env()}=postgresql://user:password@host:5432/"
            "harvester)")


def _embedded_url(why: str, level: int, *, task: bool = False) -> str:
    """The embedded server's URL (started if need be), unless HARVESTER_EMBEDDED_DB=off, or, for a
    task (``task``), unless Airflow's executor may run tasks on other machines."""
    if not embedded_allowed():
        raise DatabaseConfigError(
            f"{why}, and {EMBEDDED_ENV}=off rules the embedded PostgreSQL out: define the Airflow connection "
            f"{CONN_ID} (e.g. {conn_env()}=postgresql://user:password@host:5432/harvester)")
    if task:
        _refuse_on_distributed_executor(why)
    log.log(level, "%s: using the embedded PostgreSQL, a local server run with fsync off, not meant for "
            "production (define the connection %s, or set %s=off to make this an error)", why, CONN_ID, EMBEDDED_ENV)
    from harvester.store.embedded.server import embedded

    return embedded().start()


def _postgres_url(url: str, source: str) -> str:
    """``url`` with the scheme libpq wants; DatabaseConfigError naming ``source`` and the redacted
    URL when it is no PostgreSQL URI."""
    url = url.strip()
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() not in POSTGRES_SCHEMES:
        raise DatabaseConfigError(f"{source} is not a PostgreSQL URI ({redact_connection(url)}): expected "
                                  "postgresql://user:password@host:5432/database")
    parts = urlsplit(url)
    if "," not in parts.netloc:  # libpq's multi-host form has no single port to check
        try:
            parts.port
        except ValueError as exc:
            raise DatabaseConfigError(f"{source} ({redact_connection(url)}) has a bad port: {exc}") from None
    return "postgresql://" + rest


def _url_from_airflow_env(conn_id: str) -> str | None:
    raw = os.environ.get(conn_env(conn_id))
    if not raw:
        return None
    if raw.lstrip().startswith("{"):
        from airflow.sdk import Connection

        try:
            return Connection(conn_id=conn_id, **json.loads(raw)).get_uri()
        except (ValueError, TypeError) as exc:
            raise DatabaseConfigError(
                f"{conn_env(conn_id)} (the connection {conn_id}) does not parse ({redact_connection(raw)}): "
                f"{type(exc).__name__}: {scrub_connection(str(exc), raw)}") from None
    return raw


def cli_database_url() -> str:
    """The CLI's database: HARVESTER_DATABASE_URL, the harvester_db connection, or an embedded server
    that holds data (cli_embedded_server: started if it is stopped, said in one line on stderr). The
    CLI never initializes a new, empty embedded server on its own (`harvester db start` does): finding
    none is a DatabaseConfigError saying where it looked and how to point it."""
    if os.environ.get(URL_ENV):
        return _postgres_url(os.environ[URL_ENV], URL_ENV)
    url = _url_from_airflow_env(CONN_ID)
    if url:
        return _postgres_url(url, f"{conn_env()} (the connection {CONN_ID})")
    why = f"neither {URL_ENV} nor {conn_env()} is set"
    if not embedded_allowed():
        _embedded_url(why, logging.INFO)  # raises, naming HARVESTER_EMBEDDED_DB=off
    server = cli_embedded_server()
    if server is None:
        from harvester.store.embedded.server import cli_homes

        looked = " or ".join(str(home / "pgdata") for home in cli_homes())
        raise DatabaseConfigError(
            f"no database: {why}, and there is no embedded PostgreSQL in {looked}. Run `harvester db start` (a new, "
            f"empty one) or `make demo`, or point the CLI at yours: {URL_ENV}=postgresql://user:password@host:5432/"
            "harvester (or HARVESTER_HOME=the directory holding pgdata/)")
    running = server.is_running()
    url = server.start()
    print(f"harvester: using the embedded PostgreSQL in {server.home}"
          f"{'' if running else ' (started it; `harvester db stop` stops it)'}; set {URL_ENV} for another database",
          file=sys.stderr, flush=True)
    return url


def cli_embedded_server():
    """The embedded server the CLI uses when no database is configured: the first of
    HARVESTER_HOME (alone when set), else `.harvester/`, then the demo's `.harvester/demo/db`, that
    holds a data directory; None when none does."""
    from harvester.store.embedded.server import EmbeddedServer, cli_homes

    for home in cli_homes():
        server = EmbeddedServer(home)
        if server.exists():
            return server
    return None


def connect_url(url: str):
    import psycopg

    return psycopg.connect(url)


def _lookup(conn_id: str):
    """The Airflow connection ``conn_id``, None when no secrets backend defines it. Any other
    failure raises DatabaseConfigError (its value does not parse) or DatabaseLookupError (a secrets
    backend failed: it may pass), naming the connection and why."""
    try:
        return lookup_connection(conn_id)
    except ConnectionValueError as exc:
        raise DatabaseConfigError(str(exc)) from None
    except ConnectionLookupError as exc:
        raise DatabaseLookupError(str(exc)) from None


def airflow_connection(conn_id: str = CONN_ID):
    """The database of the Airflow connection ``conn_id``, through PostgresHook. The embedded
    server only when no secrets backend defines the connection (with a WARNING), and not even
    then with HARVESTER_EMBEDDED_DB=off."""
    conn = _lookup(conn_id)
    if conn is None:
        return connect_url(_embedded_url(f"no Airflow connection {conn_id} is defined", logging.WARNING, task=True))
    uri = redact_connection(conn.get_uri())
    if (conn.conn_type or "").lower() not in POSTGRES_SCHEMES:
        raise DatabaseConfigError(f"the Airflow connection {conn_id} is not a PostgreSQL connection (type "
                                  f"{conn.conn_type!r}: {uri}): expected postgresql://user:password@host:5432/database")
    from airflow.providers.postgres.hooks.postgres import PostgresHook

    try:
        return PostgresHook(postgres_conn_id=conn_id).get_conn()
    except Exception as exc:
        raise DatabaseLookupError(f"could not connect to the database of the Airflow connection {conn_id} "
                                  f"({uri}): {type(exc).__name__}: {exc}") from exc


def embedded_log(conn) -> Path | None:
    """The embedded server's log when `conn` is connected to one the CLI or a task may use (127.0.0.1,
    the port it was given)."""
    from harvester.store.embedded.server import EmbeddedServer, cli_homes

    if conn.info.host not in ("127.0.0.1", "localhost"):
        return None
    for home in cli_homes():
        server = EmbeddedServer(home)
        try:
            port = int(server.port_file.read_text().strip())
        except (OSError, ValueError):
            continue
        if conn.info.port == port:
            return server.logfile
    return None


def require_current_schema(conn) -> None:
    """DatabaseConfigError when migrations are pending (one query; waits for a migration under way)."""
    missing = migrations.pending(conn)
    if missing:
        where = f"{conn.info.host or 'localhost'}:{conn.info.port}/{conn.info.dbname}"
        raise DatabaseConfigError(
            f"the harvester database {where} lacks migrations {', '.join(missing)}: run `harvester db migrate` "
            "(Docker Compose: `docker compose up airflow-init`); a harvest run's begin task applies them too")


LOCK_TIMEOUT_ENV = "HARVESTER_LOCK_TIMEOUT_SECS"


def lock_timeout(environ=None) -> float:
    """HARVESTER_LOCK_TIMEOUT_SECS: how long a statement of Harvester's may wait for a lock held by
    another session (another run, a migration, an operator's transaction) before it gives up with
    LockWaitTimeout; a task then fails and Airflow retries it. Default 30 s."""
    try:
        return env_value(LOCK_TIMEOUT_ENV, environ)
    except SettingError as exc:
        raise DatabaseConfigError(str(exc)) from None


class LockWaitTimeout(RuntimeError):
    """A statement waited longer than HARVESTER_LOCK_TIMEOUT_SECS for a lock; it may pass (retry)."""

    transient = True


def lock_wait_error(exc: BaseException, where: str = "") -> LockWaitTimeout:
    """The readable form of PostgreSQL's "canceling statement due to lock timeout"."""
    diag = getattr(exc, "diag", None)
    context = (getattr(diag, "context", None) or "").strip().splitlines()
    return LockWaitTimeout(
        f"waited more than {lock_timeout():g}s ({LOCK_TIMEOUT_ENV}) for a lock another session holds"
        f"{' in ' + where if where else ''}: {str(exc).strip().splitlines()[0]}"
        f"{' (' + context[-1] + ')' if context else ''}. Another run, a migration or a long transaction held it "
        "(see pg_stat_activity); the task is retried")


def prepare(conn, *, migrate: bool = True, application_name: str | None = None):
    """Autocommit on (atomic work uses explicit transactions), the session's lock_timeout set
    (HARVESTER_LOCK_TIMEOUT_SECS: no statement waits longer for another session's lock) and its
    ``application_name`` (what pg_stat_activity shows), pending migrations applied (or, with
    ``migrate=False``, the schema checked to be current), pgvector checked (once per process and
    server: see vector_check.py) and its types registered: the connection is ready for the store."""
    from pgvector.psycopg import register_vector

    from harvester.store.vector_check import ensure_vector_works

    try:
        conn.autocommit = True
        conn.execute("SELECT set_config('lock_timeout', %s, false)", (f"{int(lock_timeout() * 1000)}ms",))
        if application_name:
            conn.execute("SELECT set_config('application_name', %s, false)", (application_name[:63],))
        if migrate:
            migrations.migrate(conn)
        else:
            require_current_schema(conn)
        ensure_vector_works(conn, embedded_log(conn))
        register_vector(conn)
    except BaseException:
        conn.close()
        raise
    return conn


def open_cli():
    return prepare(connect_url(cli_database_url()), application_name=f"harvester cli pid={os.getpid()}")


def open_task(migrate: bool = False, application_name: str | None = None):
    """A task's connection (and the Harvester page's, which does not migrate). Tasks migrate: a
    deploy that adds a migration while runs are in flight is applied by whichever task comes first
    (migrations.py: one at a time, each waiting at most a few seconds for its locks)."""
    return prepare(airflow_connection(), migrate=migrate, application_name=application_name)
