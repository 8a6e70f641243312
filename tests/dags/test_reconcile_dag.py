"""Reconciliation through real Airflow (dag.test()), real HTTP to the local CKAN portal and a real
PostgreSQL: the real data.gc.ca pair replayed as incremental runs, deletions on the portal, the
removal guard, portals that ignore ``fl``, changes indexed later than any lookback, and what it all
costs in requests and bytes."""
import copy
import logging
from datetime import datetime, timedelta, timezone

import pytest

GC_BEFORE = "data-gc-ca-snapshot-2013-06-17T11-50.jsonl"
GC_AFTER = "data-gc-ca-snapshot-2013-06-17T12-30.jsonl"
BIRMINGHAM = "data-birmingham-gov-uk.jsonl"
HUMDATA = "data-humdata-org.jsonl"
# When the first data.gc.ca snapshot was taken: the "last run" of the replay started then.
GC_FIRST_RUN = datetime(2013, 6, 17, 15, 50, tzinfo=timezone.utc)


def last_run(db):
    return db.execute("SELECT run_id, mode, status, stats, reconcile_reason FROM sync_runs"
                      " ORDER BY run_id DESC LIMIT 1").fetchone()


def searches(portal_server):
    return [params for action, params in portal_server.requests if action == "package_search"]


def replay_gc_ca(harvest, portal_server, db, samples, **conf):
    """A full sync of the first snapshot, the watermark put back to when it was taken, then the
    second snapshot served and one incremental run (with ``conf`` as its trigger params)."""
    portal_server.set_records(samples(GC_BEFORE))
    assert harvest.run(full_sync=True).state == "success"
    db.execute("UPDATE portal_sync_status SET last_successful_sync = %s", (GC_FIRST_RUN,))
    portal_server.set_records(samples(GC_AFTER))
    portal_server.requests.clear()
    assert harvest.run(**conf).state == "success"
    return last_run(db)


def gc_ca_changes(db, run_id):
    return sorted(db.execute("SELECT change_type FROM dataset_changes WHERE run_id = %s", (run_id,)).fetchall())


@pytest.mark.parametrize("ignore_fl", [False, True], ids=["fl", "portal-ignores-fl"])
def test_a_reconciling_run_catches_every_change_the_lookback_missed(
        harvest, portal_server, db, samples, caplog, ignore_fl):
    """Lookback 1h misses 7 of the 12 new datasets (their metadata_modified is up to 85 minutes behind);
    the reconciliation finds them. A portal that ignores fl sends whole records: same outcome."""
    portal_server.ignore_fl = ignore_fl
    harvest.configure(portal_server.base_url, lookback="1h")
    caplog.set_level(logging.INFO, logger="harvester")
    run_id, mode, status, stats, reason = replay_gc_ca(harvest, portal_server, db, samples, reconcile=True)
    assert (mode, status, reason) == ("incremental", "committed", "reconcile was requested")
    assert (stats["created"], stats["updated"], stats["removed"]) == (12, 6, 0)
    assert (stats["reconcile_listed"], stats["reconcile_missing"], stats["reconcile_stale"]) == (501, 7, 0)
    assert stats["reconcile_removed"] == 0
    assert gc_ca_changes(db, run_id) == [("metadata_updated",)] * 6 + [("new",)] * 12
    assert db.execute("SELECT count(*) FROM datasets WHERE removed_at IS NULL").fetchone()[0] == 501
    listings = [p for p in searches(portal_server) if p.get("fl")]
    assert listings and all(p["fl"] == "id,metadata_modified" for p in listings)
    said = "ignored fl=id,metadata_modified and sends whole records"
    assert any(said in r.getMessage() for r in caplog.records) == ignore_fl
    if ignore_fl:   # the whole records were used: nothing fetched again by id
        assert not [p for p in searches(portal_server) if p.get("fq", "").startswith("id:(")]
        assert stats["reconcile_fetched"] == 501
    else:           # the 7 fetched by id, in one request
        (by_id,) = [p for p in searches(portal_server) if p.get("fq", "").startswith("id:(")]
        assert by_id["fq"].count(" OR ") == 6 and stats["reconcile_fetched"] == 7
    status_row = db.execute("SELECT last_reconciliation, last_full_sync FROM portal_sync_status").fetchone()
    started = db.execute("SELECT started_at FROM sync_runs WHERE run_id = %s", (run_id,)).fetchone()[0]
    assert status_row[0] == started and status_row[1] < started


@pytest.mark.parametrize("lookback, reconciles", [("1h", True), ("2h", False)])
def test_count_mismatch_reconciles_on_its_own(harvest, portal_server, db, samples, caplog, lookback, reconciles):
    """Not due (the full sync just listed everything), not asked: with 1h the portal's count (501) is
    more than we hold plus what the incremental listing brought (489 + 5), so the run reconciles by
    itself; 2h catches every change and the counts agree. Both end with all 18 changes."""
    harvest.configure(portal_server.base_url, lookback=lookback)
    caplog.set_level(logging.WARNING, logger="harvester")
    run_id, mode, status, stats, reason = replay_gc_ca(harvest, portal_server, db, samples)
    assert (mode, status) == ("incremental", "committed")
    assert (stats["created"], stats["updated"]) == (12, 6)
    assert stats["portal_count"] == 501
    if reconciles:
        assert reason == ("the portal lists 501 datasets; we hold 489 live and this run brings 5 new: "
                          "7 more on the portal than this run explains")
        assert any(reason in r.getMessage() for r in caplog.records)
        assert (stats["reconcile_listed"], stats["reconcile_missing"], stats["reconcile_stale"]) == (501, 7, 0)
    else:
        assert reason is None and "reconcile_listed" not in stats
        assert len(searches(portal_server)) == 2   # the incremental listing and the count
    assert gc_ca_changes(db, run_id) == [("metadata_updated",)] * 6 + [("new",)] * 12


def test_a_deletion_is_removed_by_the_next_reconciliation_without_a_full_sync(harvest, portal_server, db, samples):
    records = samples(BIRMINGHAM)
    portal_server.set_records(records)
    harvest.configure(portal_server.base_url)
    assert harvest.run().state == "success"
    assert harvest.run().state == "success"                  # incremental, nothing changed
    assert last_run(db)[4] is None

    gone = records[4]
    portal_server.remove_record(gone["id"])
    portal_server.requests.clear()
    assert harvest.run().state == "success"
    run_id, mode, status, stats, reason = last_run(db)
    assert (mode, status) == ("incremental", "committed") and reason.startswith("the portal lists 9 datasets")
    assert (stats["removed"], stats["reconcile_removed"], stats["reconcile_listed"]) == (1, 1, 9)
    assert (stats["reconcile_missing"], stats["reconcile_stale"], stats["created"], stats["updated"]) == (0, 0, 0, 0)
    assert db.execute("SELECT source_id FROM datasets WHERE removed_at IS NOT NULL").fetchall() == [(gone["id"],)]
    assert db.execute("SELECT change_type FROM dataset_changes WHERE run_id = %s", (run_id,)).fetchall() == [("removed",)]
    assert not [p for p in searches(portal_server) if "fl" not in p and "rows" in p and p["rows"] != "0"
                and "metadata_modified:[" not in p.get("fq", "")], "no full listing of whole records"

    # Back in sync: the next run's count agrees, no reconciliation.
    assert harvest.run().state == "success"
    assert last_run(db)[4] is None and last_run(db)[3]["removed"] == 0


def test_thirty_percent_deleted_is_withheld_like_a_full_sync(harvest, portal_server, db, samples, caplog):
    records = samples(BIRMINGHAM)
    portal_server.set_records(records)
    harvest.configure(portal_server.base_url)
    assert harvest.run().state == "success"
    portal_server.set_records(records[3:])                  # 3 of 10 gone: over the 20% guard

    caplog.set_level(logging.WARNING)
    assert harvest.run().state == "success"
    run_id, mode, status, stats, reason = last_run(db)
    assert (mode, status) == ("incremental", "committed") and reason is not None
    assert (stats["removed"], stats["reconcile_removed"], stats["removals_withheld"]) == (0, 0, 3)
    warning = [r.getMessage() for r in caplog.records if r.getMessage().startswith("removal guard")]
    assert len(warning) == 1 and "this reconciliation" in warning[0] and "3 of its 10 live datasets" in warning[0]
    assert db.execute("SELECT count(*) FROM datasets WHERE removed_at IS NOT NULL").fetchone()[0] == 0

    assert harvest.run(force_removals=True).state == "success"
    stats = last_run(db)[3]
    assert (stats["removed"], stats["reconcile_removed"]) == (3, 3)
    assert db.execute("SELECT count(*) FROM datasets WHERE removed_at IS NOT NULL").fetchone()[0] == 3


def test_a_stale_dataset_and_a_scheduled_reconciliation(harvest, portal_server, db, samples):
    """An edit published with a metadata_modified older than any lookback: the incremental listing
    and the count cannot see it; the daily reconciliation does, fetches that one record and
    re-embeds it. Its listing costs a small fraction of the full sync's bytes."""
    records = samples(HUMDATA)
    portal_server.set_records(records)
    harvest.configure(portal_server.base_url)
    assert harvest.run().state == "success"
    full_bytes = last_run(db)[3]["portal_bytes"]

    edited = copy.deepcopy(records[7])
    edited["title"] = "Stale in our copy: edited behind the lookback"
    old = datetime.fromisoformat(edited["metadata_modified"]) + timedelta(seconds=1)
    edited["metadata_modified"] = old.isoformat()
    portal_server.upsert_record(edited)
    assert harvest.run().state == "success"                  # not due, counts agree: not seen
    assert last_run(db)[4] is None and last_run(db)[3]["updated"] == 0

    db.execute("UPDATE portal_sync_status SET last_reconciliation = now() - interval '25 hours'")
    portal_server.requests.clear()
    assert harvest.run().state == "success"
    run_id, mode, status, stats, reason = last_run(db)
    assert reason.startswith("the last reconciliation was 1d 1h ago (reconcile_every 1d)")
    assert (stats["reconcile_listed"], stats["reconcile_missing"], stats["reconcile_stale"]) == (len(records), 0, 1)
    assert (stats["updated"], stats["embedded"], stats["reconcile_fetched"]) == (1, 1, 1)
    assert db.execute("SELECT title FROM datasets WHERE source_id = %s", (edited["id"],)).fetchone()[0] == edited["title"]
    assert not [p for p in searches(portal_server) if p.get("rows") == "0"], "due: no count request needed"
    assert stats["portal_bytes"] * 5 < full_bytes, (stats["portal_bytes"], full_bytes)


def test_reconcile_every_zero_reconciles_every_run_and_off_never_by_schedule(harvest, portal_server, db, samples):
    records = samples(BIRMINGHAM)
    portal_server.set_records(records)
    harvest.configure(portal_server.base_url, reconcile_every=0)
    assert harvest.run().state == "success"
    assert harvest.run().state == "success"
    assert last_run(db)[4] == "reconcile_every is 0: every run reconciles"

    harvest.configure(portal_server.base_url, reconcile_every="off")
    db.execute("UPDATE portal_sync_status SET last_reconciliation = now() - interval '400 days'")
    assert harvest.run().state == "success"
    assert last_run(db)[4] is None


def test_full_sync_every_makes_a_periodic_full_sync(harvest, portal_server, db, samples):
    portal_server.set_records(samples(BIRMINGHAM))
    harvest.configure(portal_server.base_url, full_sync_every="30d")
    assert harvest.run().state == "success"
    assert harvest.run().state == "success"
    assert last_run(db)[1] == "incremental"
    db.execute("UPDATE portal_sync_status SET last_full_sync = now() - interval '31 days'")
    assert harvest.run().state == "success"
    assert last_run(db)[1] == "full"
    (started,) = db.execute("SELECT max(started_at) FROM sync_runs").fetchone()
    assert db.execute("SELECT last_full_sync, last_reconciliation FROM portal_sync_status").fetchone() == (started, started)
