"""No wait without a bound: every statement of a task waits at most HARVESTER_LOCK_TIMEOUT_SECS for
a lock another session holds, then the task fails with a message saying so (and Airflow retries
it). Real PostgreSQL, real Airflow (dag.test())."""
from __future__ import annotations

import threading
import time

import psycopg
import pytest

from harvester.store import db as store_db


@pytest.mark.parametrize("raw", ["0", "-3", "soon", "1e9"])
def test_a_bad_lock_timeout_is_named(raw):
    with pytest.raises(store_db.DatabaseConfigError, match=f"HARVESTER_LOCK_TIMEOUT_SECS={raw!r} must be a number"):
        store_db.lock_timeout({"HARVESTER_LOCK_TIMEOUT_SECS": raw})


def test_the_lock_timeout_is_set_on_every_connection(database_url, monkeypatch):
    assert store_db.lock_timeout({}) == 30.0
    monkeypatch.setenv("HARVESTER_LOCK_TIMEOUT_SECS", "2.5")
    with store_db.prepare(store_db.connect_url(database_url), application_name="harvester test") as conn:
        assert conn.execute("SELECT current_setting('lock_timeout'), current_setting('application_name')"
                            ).fetchone() == ("2500ms", "harvester test")


def test_a_task_behind_a_lock_fails_after_the_bound_saying_so(harvest, portal_server, samples, database_url,
                                                               monkeypatch, capfd, caplog):
    portal_server.set_records(samples("data-birmingham-gov-uk.jsonl")[:3])
    harvest.configure(portal_server.base_url)
    monkeypatch.setenv("HARVESTER_LOCK_TIMEOUT_SECS", "1")
    with psycopg.connect(database_url) as holder:
        holder.execute("LOCK TABLE sync_runs IN ACCESS EXCLUSIVE MODE")  # an operator's forgotten transaction
        release = threading.Timer(45, holder.rollback)  # (without the bound the run would wait until then)
        release.start()
        started = time.monotonic()
        dag_run = harvest.run()
        took = time.monotonic() - started
        release.cancel()
        holder.rollback()
    assert took < 40, f"the run waited {took:.0f}s for the lock"
    assert dag_run.state == "failed"
    out = capfd.readouterr()
    said = out.out + out.err + caplog.text
    assert "waited more than 1s (HARVESTER_LOCK_TIMEOUT_SECS) for a lock another session holds" in said, said[-3000:]
    assert harvest.run().state == "success", "with the lock gone, the next run goes through"
