"""Everything a run leaves behind, as text, for tests that look for a secret that must not be there
(test-only): every row of every table of the Harvester database, every file under AIRFLOW_HOME and
every row of Airflow's metadata database."""
from __future__ import annotations

import sqlite3
import zlib
from pathlib import Path


def database_text(db) -> str:
    """Every row of every table of the Harvester database ``db`` (a psycopg connection), as text."""
    tables = db.execute("SELECT table_schema, table_name FROM information_schema.tables"
                        " WHERE table_schema NOT IN ('pg_catalog', 'information_schema')"
                        " AND table_type = 'BASE TABLE'").fetchall()
    assert len(tables) > 5
    return "\n".join(str(row[0]) for schema, table in tables
                     for row in db.execute(f'SELECT t::text FROM "{schema}"."{table}" t').fetchall())


def airflow_home_text(home: Path) -> str:
    """Every file under ``home`` (the tests' AIRFLOW_HOME) as text (task log files, the metadata database's pages and its
    WAL), and every row of every table of the metadata database (SQLite), compressed values
    inflated: the serialized DAG, the DAG's description and docs, task instances, XComs, run confs.
    (dag.test() runs tasks in-process and logs through logging: there may be no log file.)"""
    files = [p for p in home.rglob("*") if p.is_file()]
    assert home / "airflow.db" in files
    text = [p.read_bytes().decode("utf-8", "replace") for p in files]
    with sqlite3.connect(home / "airflow.db") as meta:
        for (table,) in meta.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall():
            for row in meta.execute(f'SELECT * FROM "{table}"'):
                for value in row:
                    if isinstance(value, bytes):
                        try:
                            value = zlib.decompress(value)
                        except zlib.error:
                            pass
                        value = value.decode("utf-8", "replace")
                    text.append(str(value))
    return "\n".join(text)
