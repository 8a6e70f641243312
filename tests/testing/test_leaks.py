"""harvester.testing.leaks reads an Airflow home that this process's connections hold open (as
dag.test()'s do) without taking their SQLite locks away: another process on the same file (an
api-server a UI test starts) must not then delete the WAL those connections still write to."""
from __future__ import annotations

import contextlib
import sqlite3
import subprocess
import sys
import zlib

from harvester.testing.leaks import airflow_home_text

OTHER_PROCESS = "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); c.execute('SELECT count(*) FROM t'); c.close()"


def test_reading_a_home_leaves_this_process_connections_their_locks(tmp_path):
    home = tmp_path / "airflow"
    (home / "logs").mkdir(parents=True)
    (home / "logs" / "task.log").write_text("a task's log line\n")
    path = home / "airflow.db"
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as held:  # Airflow's pooled connection
        held.execute("PRAGMA journal_mode=WAL")
        held.execute("CREATE TABLE t (name TEXT, data BLOB)")
        held.execute("INSERT INTO t VALUES ('the first run', ?)", (zlib.compress(b"a compressed DAG"),))

        first = airflow_home_text(home)
        assert "the first run" in first and "a compressed DAG" in first and "a task's log line" in first
        # Another process opens the file and closes it: with this process's locks intact, it cannot
        # take the database for its own, so it leaves the WAL where it is.
        subprocess.run([sys.executable, "-c", OTHER_PROCESS, str(path)], check=True, timeout=60)
        assert path.with_name("airflow.db-wal").exists()
        held.execute("INSERT INTO t VALUES ('the second run', NULL)")

        second = airflow_home_text(home)  # read in this process, it failed here with "disk I/O error"
        assert "the first run" in second and "the second run" in second
        # and the second run is in the file for every process, not only in this connection's view
        seen = subprocess.run([sys.executable, "-c", "import sqlite3, sys; print(sqlite3.connect(sys.argv[1])"
                               ".execute('SELECT name FROM t ORDER BY name').fetchall())", str(path)],
                              check=True, timeout=60, capture_output=True, text=True).stdout
        assert "the second run" in seen


def test_a_home_without_a_metadata_database_is_an_error_naming_it(tmp_path):
    try:
        airflow_home_text(tmp_path)
    except AssertionError as exc:
        assert str(tmp_path) in str(exc) and "no airflow.db" in str(exc)
    else:
        raise AssertionError("a home without airflow.db was read")
