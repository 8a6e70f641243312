"""record_outcomes holds HARVESTER_OUTCOMES_KEEP_DAYS of a portal's runs and no more: every run
deletes its portal's older rows (outcomes.expire, in record_warnings), not only `harvester purge`
(issue 40: no table that grows without bound; a full sync records its failed records' errors again
each time). Real PostgreSQL."""
from datetime import timedelta

from harvester.store import outcomes

A, B = "https://a.example", "https://b.example"


def _run(db, portal):
    return db.execute("INSERT INTO sync_runs (portal_url, portal_name, mode, status) VALUES (%s, 'p', 'full',"
                      " 'running') RETURNING run_id", (portal,)).fetchone()[0]


def _outcome(db, run_id, portal, days_ago, code):
    db.execute("INSERT INTO record_outcomes (run_id, portal_url, source_id, stage, severity, code, message, recorded_at)"
               " VALUES (%s, %s, 'x', 'parse', 'error', %s, 'm', now() - make_interval(days => %s))",
               (run_id, portal, code, days_ago))


def codes(db):
    return sorted(r[0] for r in db.execute("SELECT code FROM record_outcomes"))


def test_a_run_deletes_its_portals_outcomes_older_than_the_retention(db, monkeypatch):
    old_a, old_b = _run(db, A), _run(db, B)
    db.execute("UPDATE sync_runs SET status = 'committed'")
    _outcome(db, old_a, A, 100, "a-old")
    _outcome(db, old_a, A, 10, "a-recent")
    _outcome(db, old_b, B, 100, "b-old")
    run = _run(db, A)
    assert outcomes.record_warnings(db, run, A, keep=timedelta(days=90)) == 0  # (nothing staged)
    assert codes(db) == ["a-recent", "b-old"]  # another portal's rows wait for its own runs
    monkeypatch.setenv("HARVESTER_OUTCOMES_KEEP_DAYS", "5")
    assert outcomes.expire(db, A) == 1
    assert codes(db) == ["b-old"]
