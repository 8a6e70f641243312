"""Dataset history through real Airflow runs: change types and significance (with per-portal
weights), removals after a clean full sync, the mass-removal guard, restores, the Asset event
and the review consumer, and the CLI over what the DAG wrote."""
import json
import logging

from harvester.cli.main import main
from harvester.testing.samples import edited

BIRMINGHAM = "data-birmingham-gov-uk.jsonl"


def changes(db, run_offset=0):
    return db.execute(
        "SELECT d.source_id, c.change_type, c.significance_score::float, c.requires_review, c.changed_fields,"
        " c.old_version, c.new_version FROM dataset_changes c JOIN datasets d ON d.id = c.dataset_id"
        " WHERE c.run_id = (SELECT max(run_id) - %s FROM sync_runs) ORDER BY d.source_id", (run_offset,)).fetchall()


def last_stats(db):
    return db.execute("SELECT stats FROM sync_runs ORDER BY run_id DESC LIMIT 1").fetchone()[0]



def test_change_types_and_significance(harvest, portal_server, db, samples):
    records = samples(BIRMINGHAM)
    portal_server.set_records(records)
    harvest.configure(portal_server.base_url)
    assert harvest.run().state == "success"
    assert {c[1] for c in changes(db)} == {"new"} and len(changes(db)) == len(records)

    a, b, c, d = records[:4]
    portal_server.upsert_record(edited(a, title=a["title"] + " (revised)"))
    portal_server.upsert_record(edited(b, notes=b["notes"] + " " + b["notes"]))       # +100% length
    portal_server.upsert_record(edited(c, tags=c["tags"] + [{"name": "budget"}]))
    portal_server.upsert_record(edited(d, extras=d.get("extras", []) + [{"key": "issued", "value": "2018-04-01"}]))
    assert harvest.run().state == "success"
    got = {row[0]: row[1:4] for row in changes(db)}
    assert got == {
        a["id"]: ("title_changed", 0.3, False),
        b["id"]: ("content_updated", 0.6, False),
        c["id"]: ("metadata_updated", 0.0, False),
        d["id"]: ("date_changed", 0.2, False),
    }
    stats = last_stats(db)
    assert (stats["updated"], stats["versions"], stats["review"]) == (4, 4, 0)
    assert stats["embedded"] == 2  # title and description changes only
    fields = {row[0]: row[4] for row in changes(db)}
    assert fields[a["id"]]["title"] == {"old": a["title"], "new": a["title"] + " (revised)"}
    assert fields[c["id"]]["tags"] == {"added": ["budget"], "removed": []}
    assert db.execute("SELECT count(*) FROM dataset_versions WHERE is_current").fetchone()[0] == len(records)
    assert db.execute("SELECT count(*) FROM current_datasets").fetchone()[0] == len(records)


def test_per_portal_weights_and_review(harvest, portal_server, db, samples, capsys):
    records = samples(BIRMINGHAM)
    portal_server.set_records(records)
    harvest.configure(portal_server.base_url, significance={"title": 0.5, "review_threshold": 0.5})
    assert harvest.run().state == "success"
    portal_server.upsert_record(edited(records[0], title="Purchase cards, restated"))
    portal_server.upsert_record(edited(records[1], title="Both", notes="A much shorter description."))
    assert harvest.run().state == "success"
    got = {row[0]: row[1:4] for row in changes(db)}
    assert got[records[0]["id"]] == ("title_changed", 0.5, True)
    # content 0.4 + description length 0.2 outweigh title 0.5; the sum 1.1 is capped at 1.0
    assert got[records[1]["id"]] == ("content_updated", 1.0, True)
    assert last_stats(db)["review"] == 2

    capsys.readouterr()  # what the DAG runs logged
    assert main(["changes", "-p", "test", "--review", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert sorted(c["change_type"] for c in listed) == ["content_updated", "title_changed"]
    assert main(["changes", "-p", "test", "--limit", "2"]) == 0
    out = capsys.readouterr().out
    assert "TITLE_CHANGED (REVIEW)" in out and "CONTENT_UPDATED (REVIEW)" in out
    assert "100%" in out and "50%" in out and "Version 1 -> 2" in out


def test_removal_after_a_full_sync_and_restore(harvest, portal_server, db, samples):
    records = samples(BIRMINGHAM)
    portal_server.set_records(records)
    harvest.configure(portal_server.base_url)
    assert harvest.run().state == "success"
    gone = records[0]
    portal_server.remove_record(gone["id"])

    assert harvest.run(full_sync=True).state == "success"
    assert last_stats(db)["removed"] == 1
    (row,) = changes(db)
    assert row[:4] == (gone["id"], "removed", 0.5, False) and row[5] == row[6] == 1
    assert db.execute("SELECT count(*) FROM current_datasets").fetchone()[0] == len(records) - 1
    assert db.execute("SELECT count(*) FROM dataset_versions v JOIN datasets d ON d.id = v.dataset_id"
                      " WHERE d.source_id = %s", (gone["id"],)).fetchone()[0] == 1

    portal_server.upsert_record(edited(gone))
    assert harvest.run().state == "success"
    (row,) = changes(db)
    assert row[:2] == (gone["id"], "restored")
    assert db.execute("SELECT removed_at FROM datasets WHERE source_id = %s", (gone["id"],)).fetchone() == (None,)


def test_mass_removal_guard_and_force(harvest, portal_server, db, samples, caplog):
    records = samples(BIRMINGHAM)
    portal_server.set_records(records)
    harvest.configure(portal_server.base_url)
    assert harvest.run().state == "success"
    portal_server.set_records(records[:6])             # 4 of 10 gone: over the 20% guard

    caplog.set_level(logging.WARNING)
    assert harvest.run(full_sync=True).state == "success"
    stats = last_stats(db)
    assert (stats["removed"], stats["removals_withheld"]) == (0, 4)
    assert any("force_removals" in r.getMessage() for r in caplog.records)
    assert db.execute("SELECT sync_status FROM portal_sync_status").fetchone()[0] == "completed"

    assert harvest.run(full_sync=True, force_removals=True).state == "success"
    assert last_stats(db)["removed"] == 4
    assert db.execute("SELECT count(*) FROM datasets WHERE removed_at IS NOT NULL").fetchone()[0] == 4


def test_asset_event_and_review_consumer(harvest, portal_server, db, samples, caplog):
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session

    from harvester.pipeline import review

    records = samples(BIRMINGHAM)
    portal_server.set_records(records)
    harvest.configure(portal_server.base_url, significance={"review_threshold": 0.3})
    assert harvest.run().state == "success"
    portal_server.upsert_record(edited(records[2], title="Retitled"))
    assert harvest.run().state == "success"
    run_id = db.execute("SELECT max(run_id) FROM sync_runs").fetchone()[0]

    with create_session() as session:
        events = (session.query(AssetEvent).join(AssetModel, AssetEvent.asset_id == AssetModel.id)
                  .filter(AssetModel.uri == "harvester://test/datasets").order_by(AssetEvent.id).all())
        extras = [e.extra for e in events]
    assert extras[-1] == {"run_id": run_id, "created": 0, "updated": 1, "removed": 0, "review": 1,
                          "skipped": 0, "removals_withheld": 0}
    assert extras[-2]["created"] == len(records)

    caplog.set_level(logging.INFO, logger="harvester.pipeline.review")
    ids = review.run_ids({"harvester://test/datasets": events[-1:]})
    assert ids == [run_id]
    assert review.log_changes_needing_review(db, ids) == 1
    assert any("REVIEW TITLE_CHANGED" in r.getMessage() and "Retitled" in r.getMessage() for r in caplog.records)
