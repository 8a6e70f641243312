"""Connections to the harvester database: which one, and opened ready for use.

DAG tasks use the Airflow connection ``harvester_db`` through PostgresHook. The CLI uses
HARVESTER_DATABASE_URL, else that same connection, else the embedded server. With none
configured, both fall back to the embedded PostgreSQL (store/server.py).
"""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from .migrations import migrate

log = logging.getLogger(__name__)

CONN_ID = "harvester_db"
URL_ENV = "HARVESTER_DATABASE_URL"


def redact(url: str) -> str:
    """A URL fit for a log: the password replaced."""
    parts = urlsplit(url)
    if parts.password:
        netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
        return urlunsplit(parts._replace(netloc=netloc))
    return url


def _url_from_airflow_env(conn_id: str) -> str | None:
    raw = os.environ.get(f"AIRFLOW_CONN_{conn_id.upper()}")
    if not raw:
        return None
    if raw.lstrip().startswith("{"):
        from airflow.sdk import Connection

        return Connection(conn_id=conn_id, **json.loads(raw)).get_uri()
    return raw


def cli_database_url() -> str:
    """The CLI's database: HARVESTER_DATABASE_URL, the harvester_db connection, or the embedded server."""
    url = os.environ.get(URL_ENV) or _url_from_airflow_env(CONN_ID)
    if url:
        scheme, rest = url.split("://", 1)
        if scheme in ("postgres", "postgresql+psycopg", "postgresql+psycopg2"):
            url = "postgresql://" + rest
        return url
    from .server import embedded

    return embedded().start()


def connect_url(url: str):
    import psycopg

    return psycopg.connect(url)


def airflow_connection(conn_id: str = CONN_ID):
    """The harvester_db connection through PostgresHook, or the embedded server when it is not defined."""
    try:
        from airflow.sdk import Connection

        Connection.get(conn_id)
    except Exception as exc:  # AirflowNotFoundException, or no Airflow at all
        log.info("Airflow connection %r is not defined (%s); using the embedded PostgreSQL", conn_id,
                 type(exc).__name__)
        from .server import embedded

        return connect_url(embedded().start())
    from airflow.providers.postgres.hooks.postgres import PostgresHook

    return PostgresHook(postgres_conn_id=conn_id).get_conn()


def embedded_log(conn) -> Path | None:
    """The embedded server's log when `conn` is connected to it (127.0.0.1, the port it was given)."""
    from .server import embedded

    server = embedded()
    try:
        port = int(server.port_file.read_text().strip())
    except (OSError, ValueError):
        return None
    return server.logfile if conn.info.host in ("127.0.0.1", "localhost") and conn.info.port == port else None


def prepare(conn):
    """Autocommit on (atomic work uses explicit transactions), migrations applied, pgvector
    checked (once per process and server: see vector_check.py) and its types registered: the
    connection is ready for the store."""
    from pgvector.psycopg import register_vector

    from .vector_check import ensure_vector_works

    conn.autocommit = True
    migrate(conn)
    ensure_vector_works(conn, embedded_log(conn))
    register_vector(conn)
    return conn


def open_cli():
    return prepare(connect_url(cli_database_url()))


def open_task():
    return prepare(airflow_connection())
