"""Everything a run leaves behind, as text, for tests that look for a secret that must not be there
(test-only): every row of every table of the Harvester database, every file under AIRFLOW_HOME and
every row of Airflow's metadata database."""
from __future__ import annotations

import contextlib
import sqlite3
import subprocess
import sys
import tempfile
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


def airflow_home_text(home: Path, timeout: float = 120) -> str:
    """Every file under ``home`` (the tests' AIRFLOW_HOME) as text (task log files, the metadata database's pages and its
    WAL), and every row of every table of the metadata database (SQLite), compressed values
    inflated: the serialized DAG, the DAG's description and docs, task instances, XComs, run confs.
    (dag.test() runs tasks in-process and logs through logging: there may be no log file.)

    Read by a separate process, never by this one. Airflow's connections in this process hold the
    SQLite file open in WAL mode with POSIX locks, and POSIX drops every lock a process holds on a
    file as soon as that process closes any descriptor of it: reading the files' bytes here would
    leave Airflow's connections unlocked for the rest of the process. The next other process on the
    file (an api-server a UI test starts on it) then takes the database for its own at its close,
    checkpoints and deletes the WAL that this process still writes to: later runs' rows go to a
    deleted file, and a new connection here fails with "disk I/O error" (both seen in whole runs
    of the suite; tests/testing/test_leaks.py shows it)."""
    with tempfile.TemporaryDirectory(prefix="harvester-leaks-") as directory:
        out = Path(directory) / "home.txt"
        try:
            done = subprocess.run([sys.executable, "-I", __file__, str(home), str(out)], capture_output=True, text=True,
                                  timeout=timeout, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as exc:
            raise AssertionError(f"reading {home} took more than {timeout:.0f} s") from exc
        assert done.returncode == 0, f"reading {home} failed ({done.returncode}): {done.stderr[-3000:]}"
        return out.read_text(encoding="utf-8")


def _home_text(home: Path) -> str:
    """What ``airflow_home_text`` returns, read in the process that calls this."""
    files = [p for p in home.rglob("*") if p.is_file()]
    assert home / "airflow.db" in files, f"no airflow.db in {home}"
    text = [p.read_bytes().decode("utf-8", "replace") for p in files]
    with contextlib.closing(sqlite3.connect(home / "airflow.db", timeout=30)) as meta:
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


if __name__ == "__main__":  # python leaks.py HOME OUT: airflow_home_text's reading process
    Path(sys.argv[2]).write_text(_home_text(Path(sys.argv[1])), encoding="utf-8", errors="replace")
