"""Dataset history on a real PostgreSQL: versions, change rows, removals, restorations and the
history commands, driven by the real pipeline steps against the local CKAN portal over HTTP."""
import argparse
import copy
import json
import logging
from datetime import datetime, timedelta, timezone

import psycopg
import pytest
import yaml

from harvester.domain import changes as ch
from harvester.domain import diff
from harvester.cli import history as history_cli
from harvester.pipeline import steps as pipeline
from harvester.sources.ckan import CkanClient
from harvester.config.portals import get_portal
from harvester.store import datasets, history, runs, staging
from harvester.store.staging import as_jsonb

BIRMINGHAM = "data-birmingham-gov-uk.jsonl"
GC_BEFORE = "data-gc-ca-snapshot-2013-06-17T11-50.jsonl"
GC_AFTER = "data-gc-ca-snapshot-2013-06-17T12-30.jsonl"
PORTAL = "hist"


# -- helpers ------------------------------------------------------------------------------------
@pytest.fixture
def portal(portal_server, tmp_path, monkeypatch):
    """The local portal, named in a portals.yaml so the CLI resolves it the same way."""
    path = tmp_path / "portals.yaml"
    path.write_text(yaml.safe_dump({"portals": [
        {"name": PORTAL, "url": portal_server.base_url, "politeness_delay": 0, "page_size": 100, "max_retries": 0}]}))
    monkeypatch.setenv("HARVESTER_PORTALS_FILE", str(path))
    return get_portal(PORTAL)


def harvest_once(db, reader, portal, *, full=True, max_share=0.2, force=False, config=ch.DEFAULT):
    """One run as the upsert will do it: begin, fetch, classify, compute changes, then one
    transaction merging datasets, writing history, removing (after a clean full sync), committing."""
    run_id = pipeline.begin(db, portal, full_sync=full)["run_id"]
    client = CkanClient(portal.url, politeness_delay=0, max_retries=0)
    pipeline.fetch_modified(db, portal, run_id, client)
    classified = pipeline.hash_compare(db, reader, portal, run_id)
    computed = history.compute_changes(db, reader, run_id, portal.url, config)  # with this test's weights
    with db.transaction():
        run = runs.require_running(db, run_id)
        db.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (portal.url,))
        unchanged = run.stats.get("unchanged")  # as the upsert passes it (hash_compare's count)
        merged = datasets.merge(db, run_id, portal.url, run.started_at, "none", unchanged=unchanged)
        written = history.write_history(db, run_id, portal.url, run.started_at)
        removals = {}
        if run.mode == "full" and not classified["failed"]:
            removals = history.apply_removals(db, run_id, portal.url, run.started_at, max_share=max_share,
                                              force=force, removed_significance=config.removed,
                                              review_threshold=config.review_threshold)
        stats = {**run.stats, **merged, "removed": removals.get("removed", 0)}
        runs.commit(db, run, stats, datasets_synced=stats.get("fetched", 0))
        staging.clear(db, run_id)
    return {"run_id": run_id, "mode": run.mode, "seen_at": run.started_at, "classified": classified,
            "computed": computed, "written": written, "removals": removals}


def changes_of(db, run_id):
    return db.execute(
        "SELECT d.source_id, c.change_type, c.old_version, c.new_version, c.significance_score::float,"
        " c.requires_review, c.changed_fields FROM dataset_changes c JOIN datasets d ON d.id = c.dataset_id"
        " WHERE c.run_id = %s ORDER BY d.source_id", (run_id,)).fetchall()


def versions_of(db, source_id):
    return db.execute(
        "SELECT v.version_number, v.is_current, v.change_type, v.first_seen_at,"
        " coalesce(v.last_seen_at, greatest(d.updated_at, k.last_seen_at)), v.content_hash,"
        " v.snapshot FROM dataset_versions v JOIN datasets d ON d.id = v.dataset_id"
        " LEFT JOIN dataset_seen k ON k.dataset_id = d.id WHERE d.source_id = %s"
        " ORDER BY v.version_number", (source_id,)).fetchall()


def dataset_id(db, source_id):
    return db.execute("SELECT id FROM datasets WHERE source_id = %s", (source_id,)).fetchone()[0]


def assert_one_current_version_each(db):
    assert db.execute(
        "SELECT count(*) FROM datasets d WHERE (SELECT count(*) FROM dataset_versions v"
        " WHERE v.dataset_id = d.id AND v.is_current) <> 1").fetchone()[0] == 0


def edited(record, **fields):
    out = copy.deepcopy(record)
    out.update(fields)
    return out


def cli(*argv):
    parser = argparse.ArgumentParser(prog="harvester")
    history_cli.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(list(argv))
    return args.func(args)


@pytest.fixture
def birmingham(samples):
    """Ten real Birmingham records; the fourth gets a DCAT ``issued`` extra to change later."""
    records = copy.deepcopy(samples(BIRMINGHAM))
    records[3]["extras"] = [{"key": "issued", "value": "2021-01-08"}]
    return records


# -- versions and change types ------------------------------------------------------------------
def test_first_full_sync_records_a_new_version_and_change_per_dataset(db, reader, portal, portal_server, birmingham):
    portal_server.set_records(birmingham)
    first = harvest_once(db, reader, portal)
    assert first["computed"]["new"] == 10 and first["computed"]["review"] == 0
    assert first["written"] == {"versions": 10, "changes": 10, "refreshed": 0, "snapshots_dropped": 0,
                                 "last_seen_cleared": 0}
    rows = changes_of(db, first["run_id"])
    assert {(r[1], r[2], r[3], r[4], r[5], json.dumps(r[6])) for r in rows} == {("new", None, 1, 0.0, False, "{}")}
    (version,) = versions_of(db, birmingham[0]["id"])
    assert version[:5] == (1, True, "new", first["seen_at"], first["seen_at"])
    rec = birmingham[0]
    assert version[6] is None  # the current version's snapshot is the dataset's row's (sql/031)
    snapshot = history.get_version(db, dataset_id(db, rec["id"]), 1)["snapshot"]
    assert snapshot["title"] == rec["title"] and snapshot["name"] == rec["name"]
    assert db.execute("SELECT count(*) FROM staging_changes").fetchone()[0] == 0
    assert db.execute("SELECT count(*) FROM current_datasets").fetchone()[0] == 10
    assert_one_current_version_each(db)


def test_each_kind_of_edit_becomes_its_change_type_and_a_new_version(db, reader, portal, portal_server, birmingham):
    portal_server.set_records(birmingham)
    first = harvest_once(db, reader, portal)
    title, description, tags, date, both = (birmingham[i] for i in (0, 1, 2, 3, 4))
    portal_server.upsert_record(edited(title, title=title["title"] + " (revised)"))
    portal_server.upsert_record(edited(description, notes=description["notes"] + " Now with refunds."))
    portal_server.upsert_record(edited(tags, tags=tags["tags"] + [{"name": "refunds", "display_name": "refunds"}]))
    portal_server.upsert_record(edited(date, extras=[{"key": "issued", "value": "2021-02-01"}]))
    portal_server.upsert_record(edited(both, title="Card spending", notes="Rewritten entirely."))

    second = harvest_once(db, reader, portal)
    assert second["classified"]["updated"] == 5 and second["classified"]["unchanged"] == 5
    computed = second["computed"]
    assert (computed["title_changed"], computed["content_updated"], computed["metadata_updated"],
            computed["date_changed"], computed["new"], computed["review"]) == (1, 2, 1, 1, 0, 1)
    assert second["written"] == {"versions": 5, "changes": 5, "refreshed": 0, "snapshots_dropped": 0,
                                  "last_seen_cleared": 0}
    got = {r[0]: r[1:] for r in changes_of(db, second["run_id"])}
    assert got[title["id"]][:5] == ("title_changed", 1, 2, 0.3, False)
    assert set(got[title["id"]][5]) == {"title"}
    assert got[description["id"]][:5] == ("content_updated", 1, 2, 0.4, False)
    assert got[tags["id"]][:5] == ("metadata_updated", 1, 2, 0.0, False)
    assert got[tags["id"]][5] == {"tags": {"added": ["refunds"], "removed": []}}
    assert got[date["id"]][:5] == ("date_changed", 1, 2, 0.2, False)
    assert got[date["id"]][5]["dates"] == {"extras.issued": {"old": "2021-01-08", "new": "2021-02-01"}}
    # title 0.3 + description 0.4 + its length changed by far more than 20% 0.2 = 0.9 >= 0.7
    assert got[both["id"]][:5] == ("content_updated", 1, 2, 0.9, True)

    old, new = versions_of(db, title["id"])
    assert (old[0], old[1], old[3], old[4]) == (1, False, first["seen_at"], first["seen_at"])
    assert (new[0], new[1], new[2], new[3], new[4]) == (2, True, "title_changed", second["seen_at"], second["seen_at"])
    # the replaced version took its snapshot as it was; the current one stores none (sql/031)
    assert old[6]["title"] == title["title"] and new[6] is None
    assert history.get_version(db, dataset_id(db, title["id"]), 2)["snapshot"]["title"] == title["title"] + " (revised)"
    assert new[5] == db.execute("SELECT content_hash FROM datasets WHERE source_id = %s", (title["id"],)).fetchone()[0]
    (unchanged,) = versions_of(db, birmingham[5]["id"])
    assert (unchanged[0], unchanged[3], unchanged[4]) == (1, first["seen_at"], second["seen_at"])
    assert_one_current_version_each(db)


def test_an_unchanged_run_writes_no_version_and_moves_last_seen(db, reader, portal, portal_server, birmingham):
    """The current version's last_seen_at is its dataset's (sql/033): an unchanged run writes none."""
    portal_server.set_records(birmingham)
    first = harvest_once(db, reader, portal)
    second = harvest_once(db, reader, portal)
    assert second["classified"]["unchanged"] == 10
    assert second["written"] == {"versions": 0, "changes": 0, "refreshed": 0, "snapshots_dropped": 0,
                                 "last_seen_cleared": 0}
    assert db.execute("SELECT count(*) FROM dataset_versions").fetchone()[0] == 10
    assert db.execute("SELECT count(*) FROM dataset_changes").fetchone()[0] == 10
    assert db.execute("SELECT DISTINCT version_first_seen_at, version_last_seen_at FROM current_datasets"
                      ).fetchall() == [(first["seen_at"], second["seen_at"])]


def test_the_upsert_marks_a_runs_unchanged_records_seen_and_skips_that_when_it_has_none(
        db, reader, portal, portal_server, birmingham):
    """The upsert's pass marking unchanged records seen (dataset_seen, sql/044, which their datasets'
    last sighting and their current versions' read, sql/033) runs only when hash_compare counted some (issue 40: a first sync has
    none to look for); a second run of an unchanged portal, through the pipeline's own upsert,
    still marks every one."""
    portal_server.set_records(birmingham)
    seen = []
    for unchanged, created in ((0, 10), (10, 0)):
        run_id = pipeline.begin(db, portal, full_sync=True)["run_id"]
        pipeline.fetch_modified(db, portal, run_id, CkanClient(portal.url, politeness_delay=0, max_retries=0))
        classified = pipeline.hash_compare(db, reader, portal, run_id)
        stats = pipeline.upsert(db, portal, run_id, "none")
        assert runs.get(db, run_id).status == "committed"
        assert (classified["unchanged"], stats["created"]) == (unchanged, created)
        seen.append(runs.get(db, run_id).started_at)
    assert db.execute("SELECT DISTINCT last_seen_at FROM current_datasets").fetchall() == [(seen[-1],)]
    assert db.execute("SELECT DISTINCT version_first_seen_at, version_last_seen_at FROM current_datasets"
                      ).fetchall() == [(seen[0], seen[-1])]


def row_versions(db):
    """(ctid, xmin) of every dataset_versions row: equal before and after a run that wrote none."""
    return sorted(db.execute("SELECT ctid::text, xmin::text FROM dataset_versions").fetchall())


def test_an_unchanged_full_sync_or_incremental_writes_no_version_row(db, reader, portal, portal_server, birmingham):
    """The current version's last_seen_at is its dataset's (sql/033): a run that sees datasets
    unchanged, full or incremental, writes no dataset_versions row, and every reader gives the run's
    start as their last sighting. (Fails on the code before: it moved every one.)"""
    portal_server.set_records(birmingham)
    harvest_once(db, reader, portal)
    before = row_versions(db)
    full = harvest_once(db, reader, portal)
    assert full["classified"]["unchanged"] == 10 and row_versions(db) == before
    # re-listed with a later modified time, nothing tracked changed: unchanged in an incremental run
    for rec in birmingham[:3]:
        portal_server.upsert_record(edited(rec, metadata_modified="2031-01-01T00:00:00"))
    incremental = harvest_once(db, reader, portal, full=False)
    assert incremental["mode"] == "incremental" and incremental["classified"]["unchanged"] == 3
    assert incremental["written"] == {"versions": 0, "changes": 0, "refreshed": 0, "snapshots_dropped": 0,
                                      "last_seen_cleared": 0}
    assert row_versions(db) == before
    seen = {r[0]: r[1] for r in db.execute("SELECT source_id, version_last_seen_at FROM current_datasets")}
    assert seen == {rec["id"]: incremental["seen_at"] if i < 3 else full["seen_at"]
                    for i, rec in enumerate(birmingham)}
    assert db.execute("SELECT count(*) FROM dataset_versions WHERE last_seen_at IS NOT NULL").fetchone()[0] == 0


def dataset_rows(db):
    """(source id, ctid, xmin) of every datasets row: equal before and after a run that wrote none."""
    return sorted(db.execute("SELECT source_id, ctid::text, xmin::text FROM datasets").fetchall())


def last_sightings(db, portal):
    """source id -> when a run last saw it, as each reader gives it: current_datasets, the dataset's
    detail (UI, CLI), the export, and its current version (its dataset's, sql/033)."""
    from harvester.store import export

    columns = [c.name for c in export.dataset_columns()]
    with db.transaction():  # (the export reads through a server-side cursor)
        exported = {row[columns.index("source_id")]: row[columns.index("last_seen_at")]
                    for batch in export.dataset_batches(db, portal_url=portal.url) for row in batch}
    view = dict(db.execute("SELECT source_id, last_seen_at FROM current_datasets").fetchall())
    versions = dict(db.execute("SELECT source_id, version_last_seen_at FROM current_datasets").fetchall())
    detail = {s: history.dataset_detail(db, portal.url, s)["last_seen_at"] for s in view}
    numbers = dict(db.execute("SELECT d.source_id, v.version_number FROM dataset_versions v"
                              " JOIN datasets d ON d.id = v.dataset_id WHERE v.is_current").fetchall())
    current = {s: history.get_version(db, dataset_id(db, s), numbers[s])["last_seen_at"] for s in view}
    assert exported == view == versions == detail == current, (exported, view, versions, detail, current)
    return view


def test_an_unchanged_run_writes_no_datasets_row_and_every_reader_gives_its_sighting(
        db, reader, portal, portal_server, birmingham):
    """sql/044 (issue 40: bytes a dataset, full syncs): a run that sees datasets unchanged writes
    their sighting to dataset_seen, not a new version of each dataset's row (the code before wrote
    every row of the portal at every full sync); every reader gives the run's start. A dataset
    changed later reads its change's time, though its row in dataset_seen is older; an unchanged
    record whose portal gives a new modified time has it taken into its row, and only that one."""
    portal_server.set_records(birmingham)
    first = harvest_once(db, reader, portal)
    assert db.execute("SELECT count(*) FROM dataset_seen").fetchone()[0] == 0  # a first sync writes none
    assert set(last_sightings(db, portal).values()) == {first["seen_at"]}
    before = dataset_rows(db)
    full = harvest_once(db, reader, portal)
    assert full["classified"]["unchanged"] == 10
    assert dataset_rows(db) == before
    assert db.execute("SELECT count(*), min(last_seen_at), max(last_seen_at) FROM dataset_seen").fetchone() == (
        10, full["seen_at"], full["seen_at"])
    assert set(last_sightings(db, portal).values()) == {full["seen_at"]}

    # one record edited, one re-listed with a later modified time (nothing tracked changed)
    portal_server.upsert_record(edited(birmingham[0], title="A new title", metadata_modified="2031-01-01T00:00:00"))
    portal_server.upsert_record(edited(birmingham[1], metadata_modified="2031-01-01T00:00:00"))
    incremental = harvest_once(db, reader, portal, full=False)
    assert incremental["classified"]["unchanged"] == 1 and incremental["classified"]["updated"] == 1
    after = dict((s, (c, x)) for s, c, x in dataset_rows(db))
    assert {s for s, c, x in before if after[s] != (c, x)} == {birmingham[0]["id"], birmingham[1]["id"]}
    assert db.execute("SELECT metadata_modified FROM datasets WHERE source_id = %s",
                      (birmingham[1]["id"],)).fetchone()[0] == datetime(2031, 1, 1, tzinfo=timezone.utc)
    # the edited dataset's row in dataset_seen is the full sync's, older than its change
    assert db.execute("SELECT k.last_seen_at FROM dataset_seen k JOIN datasets d ON d.id = k.dataset_id"
                      " WHERE d.source_id = %s", (birmingham[0]["id"],)).fetchone()[0] == full["seen_at"]
    sightings = last_sightings(db, portal)
    assert sightings == {rec["id"]: incremental["seen_at"] if i < 2 else full["seen_at"]
                         for i, rec in enumerate(birmingham)}


def test_every_versions_last_seen_reads_as_before_through_new_unchanged_edited_removed_restored_edited(
        db, reader, portal, portal_server, birmingham, capsys):
    """Through runs that make a dataset new, see it unchanged, edited, removed, restored (unchanged
    or edited) and edited again, every version's first and last sighting as each reader gives it
    (get_version, list_versions, `harvester versions --json`, current_datasets) is what the writer
    before sql/033 stored: a version's last_seen_at is the start of the last run that saw it current."""
    a, b, c, d, e = birmingham[:5]  # a: back unchanged then edited; b: back edited; d: gone for good
    portal_server.set_records(birmingham)
    s = [None] + [harvest_once(db, reader, portal)["seen_at"]]                 # s[1]: all new
    s.append(harvest_once(db, reader, portal)["seen_at"])                      # s[2]: unchanged
    portal_server.upsert_record(edited(e, title="E, edited"))
    s.append(harvest_once(db, reader, portal)["seen_at"])                      # s[3]: e edited
    for rec in (a, b, d):
        portal_server.remove_record(rec["id"])
    s.append(harvest_once(db, reader, portal, force=True)["seen_at"])         # s[4]: a, b, d removed
    portal_server.upsert_record(a)
    portal_server.upsert_record(edited(b, title="B, renamed while away"))
    portal_server.upsert_record(edited(e, title="E, edited twice"))
    s.append(harvest_once(db, reader, portal)["seen_at"])                      # s[5]: a, b back; e edited
    portal_server.upsert_record(edited(a, title="A, edited"))
    portal_server.upsert_record(edited(b, title="B, edited again"))
    s.append(harvest_once(db, reader, portal)["seen_at"])                      # s[6]: a, b edited
    expected = {  # (first seen, last seen) of versions 1, 2, ...
        a["id"]: [(s[1], s[5]), (s[6], s[6])],
        b["id"]: [(s[1], s[3]), (s[5], s[5]), (s[6], s[6])],
        c["id"]: [(s[1], s[6])],
        d["id"]: [(s[1], s[3])],
        e["id"]: [(s[1], s[2]), (s[3], s[4]), (s[5], s[6])],
    }
    live = dict(db.execute("SELECT source_id, version_last_seen_at FROM current_datasets").fetchall())
    for source_id, spans in expected.items():
        ident = dataset_id(db, source_id)
        got = [(v["first_seen_at"], v["last_seen_at"]) for v in reversed(history.list_versions(db, ident))]
        assert got == spans, source_id
        assert [(v["first_seen_at"], v["last_seen_at"]) for v in
                (history.get_version(db, ident, n) for n in range(1, len(spans) + 1))] == spans, source_id
        assert cli("versions", "-p", PORTAL, "--id", source_id, "--json") == 0
        listed = json.loads(capsys.readouterr().out)["versions"]
        assert [(datetime.fromisoformat(v["first_seen_at"]), datetime.fromisoformat(v["last_seen_at"]))
                for v in reversed(listed)] == spans, source_id
        if source_id != d["id"]:
            assert live[source_id] == spans[-1][1]
    assert d["id"] not in live
    # only the versions a run replaced hold a last_seen_at of their own
    assert db.execute("SELECT count(*) FILTER (WHERE is_current), count(*) FILTER (WHERE NOT is_current)"
                      " FROM dataset_versions WHERE last_seen_at IS NOT NULL").fetchone() == (0, 5)


def test_a_current_versions_own_last_seen_is_read_until_a_run_sees_it_later(
        db, reader, portal, portal_server, birmingham):
    """A current version holding a last_seen_at of its own, later than its dataset's (sql/033 keeps
    such a one: the writer before kept the later of a version's sighting and a run's start), reads
    it; a run that sees the dataset at or after it drops it (its dataset's then reads the same),
    one whose time is still before it keeps it. Found by the partial index, not a pass over the run."""
    portal_server.set_records(birmingham[:3])
    first = harvest_once(db, reader, portal)
    ids = [dataset_id(db, rec["id"]) for rec in birmingham[:3]]
    db.execute("UPDATE dataset_versions SET last_seen_at = %s WHERE dataset_id = %s",
               (first["seen_at"] + timedelta(microseconds=1), ids[0]))
    far = datetime(2100, 1, 1, tzinfo=timezone.utc)
    db.execute("UPDATE dataset_versions SET last_seen_at = %s WHERE dataset_id = %s", (far, ids[1]))
    assert history.get_version(db, ids[0], 1)["last_seen_at"] == first["seen_at"] + timedelta(microseconds=1)
    second = harvest_once(db, reader, portal)
    assert second["written"]["last_seen_cleared"] == 1
    assert [history.get_version(db, i, 1)["last_seen_at"] for i in ids] == [second["seen_at"], far, second["seen_at"]]
    assert db.execute("SELECT dataset_id FROM dataset_versions WHERE last_seen_at IS NOT NULL").fetchall() == [
        (ids[1],)]


def test_a_new_datasets_snapshot_from_its_decoded_record_is_the_canonical_one(db, samples):
    """compute_changes takes a new dataset's snapshot as made from its record decoded from staging's
    jsonb, without the JSON round trip (ch.snapshot(decoded=True), issue 40): the same snapshot,
    type for type, for the first 300 records of every CKAN sample file, read back from PostgreSQL
    as the step reads it. (Fails on the code before: snapshot took no ``decoded``.)"""
    from harvester.store.staging import as_jsonb
    from harvester.testing.samples import samples_dir

    files = sorted(p.name for p in samples_dir().glob("*.jsonl"))
    records = [r for name in files for r in samples(name)[:300]]  # (every file's first 300: seconds)
    assert len(files) >= 10 and len(records) > 1000
    decoded = [row[0] for row in db.execute("SELECT jsonb_array_elements(%s)", (as_jsonb(records),))]
    assert len(decoded) == len(records)
    for raw in decoded:
        title, description = raw.get("title"), raw.get("notes")
        title = title if isinstance(title, str) else None
        description = description if isinstance(description, str) else None
        canonical = ch.snapshot(title, description, raw)
        fast = ch.snapshot(title, description, raw, decoded=True)
        assert json.dumps(fast, sort_keys=True) == json.dumps(canonical, sort_keys=True), raw.get("id")
        assert fast == canonical


def test_one_current_version_is_enforced_by_the_schema(db, reader, portal, portal_server, birmingham):
    portal_server.set_records(birmingham[:1])
    harvest_once(db, reader, portal)
    with pytest.raises(psycopg.errors.UniqueViolation):
        db.execute("INSERT INTO dataset_versions (dataset_id, version_number, content_hash, metadata_hash,"
                   " snapshot, is_current, change_type, first_seen_at, last_seen_at)"
                   " SELECT dataset_id, 2, content_hash, metadata_hash, snapshot, true, 'metadata_updated',"
                   " now(), now() FROM dataset_versions")


# -- removals and restorations -----------------------------------------------------------------
def test_removal_only_after_a_full_sync_then_restoration(db, reader, portal, portal_server, birmingham):
    portal_server.set_records(birmingham)
    harvest_once(db, reader, portal)
    gone = birmingham[6]
    assert portal_server.remove_record(gone["id"])

    incremental = harvest_once(db, reader, portal, full=False)
    assert incremental["mode"] == "incremental" and incremental["removals"] == {}
    with pytest.raises(ValueError, match="only a full sync"), db.transaction():
        history.apply_removals(db, incremental["run_id"], portal.url, incremental["seen_at"])
    assert db.execute("SELECT count(*) FROM datasets WHERE removed_at IS NOT NULL").fetchone()[0] == 0

    full = harvest_once(db, reader, portal)
    assert full["removals"] == {"removed": 1, "would_remove": 1, "removal_guard_tripped": 0}
    assert runs.get(db, full["run_id"]).stats["removed"] == 1
    assert db.execute("SELECT removed_at FROM datasets WHERE source_id = %s", (gone["id"],)).fetchone()[0] == \
        full["seen_at"]
    assert changes_of(db, full["run_id"]) == [(gone["id"], "removed", 1, 1, 0.5, False, {})]
    assert [v[:2] for v in versions_of(db, gone["id"])] == [(1, True)]  # the last state stays current
    assert gone["id"] not in {r[0] for r in db.execute("SELECT source_id FROM current_datasets")}
    assert db.execute("SELECT count(*) FROM current_datasets").fetchone()[0] == 9

    # Back unchanged: restored, no new version.
    portal_server.upsert_record(gone)
    back = harvest_once(db, reader, portal)
    assert back["computed"]["restored"] == 1 and back["removals"]["removed"] == 0
    assert changes_of(db, back["run_id"]) == [(gone["id"], "restored", 1, 1, 0.5, False, {})]
    assert db.execute("SELECT removed_at FROM datasets WHERE source_id = %s", (gone["id"],)).fetchone()[0] is None
    assert [v[:2] for v in versions_of(db, gone["id"])] == [(1, True)]
    assert versions_of(db, gone["id"])[0][4] == back["seen_at"]

    # Gone again, then back with a new title: restored with the change, a new version, review.
    portal_server.remove_record(gone["id"])
    harvest_once(db, reader, portal)
    portal_server.upsert_record(edited(gone, title="Renamed while away"))
    again = harvest_once(db, reader, portal)
    ((source_id, kind, old, new, significance, review, fields),) = changes_of(db, again["run_id"])
    assert (kind, old, new, significance, review) == ("restored", 1, 2, 0.8, True)
    assert fields["title"] == {"old": gone["title"], "new": "Renamed while away"}
    assert [v[:3] for v in versions_of(db, gone["id"])] == [(1, False, "new"), (2, True, "restored")]
    assert_one_current_version_each(db)


def test_removal_guard_keeps_everything_unless_forced(db, reader, portal, portal_server, birmingham, caplog):
    portal_server.set_records(birmingham)
    harvest_once(db, reader, portal)
    for record in birmingham[:3]:
        portal_server.remove_record(record["id"])

    with caplog.at_level(logging.WARNING, logger="harvester.store.history"):
        guarded = harvest_once(db, reader, portal, max_share=0.2)
    assert guarded["removals"] == {"removed": 0, "would_remove": 3, "removal_guard_tripped": 1}
    assert runs.get(db, guarded["run_id"]).status == "committed"
    assert db.execute("SELECT count(*) FROM datasets WHERE removed_at IS NOT NULL").fetchone()[0] == 0
    assert db.execute("SELECT count(*) FROM dataset_changes WHERE change_type = 'removed'").fetchone()[0] == 0
    (warning,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert "3 of its 10 live datasets" in warning.getMessage() and "force_removals" in warning.getMessage()

    assert harvest_once(db, reader, portal, max_share=0.3)["removals"]["removed"] == 3  # 30% is allowed
    for record in birmingham[:3]:
        portal_server.upsert_record(record)
    harvest_once(db, reader, portal)
    for record in birmingham[:3]:
        portal_server.remove_record(record["id"])
    forced = harvest_once(db, reader, portal, max_share=0.2, force=True)
    assert forced["removals"] == {"removed": 3, "would_remove": 3, "removal_guard_tripped": 0}
    assert db.execute("SELECT count(*) FROM current_datasets").fetchone()[0] == 7


def test_an_empty_listing_removes_nothing(db, reader, portal, portal_server, birmingham):
    portal_server.set_records(birmingham)
    harvest_once(db, reader, portal)
    portal_server.set_records([])
    empty = harvest_once(db, reader, portal)
    assert empty["removals"]["removal_guard_tripped"] == 1
    assert db.execute("SELECT count(*) FROM current_datasets").fetchone()[0] == 10


# -- the real data.gc.ca pair ------------------------------------------------------------------
def test_data_gc_ca_forty_minutes_later(db, reader, portal, portal_server, samples):
    portal_server.set_records(samples(GC_BEFORE))
    first = harvest_once(db, reader, portal)
    assert first["computed"]["new"] == 489
    assert db.execute("SELECT change_type, count(*) FROM dataset_changes GROUP BY 1").fetchall() == [("new", 489)]

    portal_server.set_records(samples(GC_AFTER))
    second = harvest_once(db, reader, portal)
    rows = changes_of(db, second["run_id"])
    kinds = {}
    for row in rows:
        kinds[row[1]] = kinds.get(row[1], 0) + 1
    assert kinds == {"new": 12, "metadata_updated": 6}
    assert second["removals"]["removed"] == 0
    updated = [r for r in rows if r[1] == "metadata_updated"]
    assert all((r[2], r[3]) == (1, 2) and set(r[6]) == {"resources"} for r in updated)
    assert db.execute("SELECT count(*) FROM dataset_versions").fetchone()[0] == 501 + 6
    assert db.execute("SELECT count(*) FROM current_datasets").fetchone()[0] == 501
    assert_one_current_version_each(db)


# -- the odd cases -----------------------------------------------------------------------------
def test_compute_changes_is_idempotent_and_required(db, reader, portal, portal_server, birmingham):
    portal_server.set_records(birmingham)
    run_id = pipeline.begin(db, portal, full_sync=True)["run_id"]
    pipeline.fetch_modified(db, portal, run_id, CkanClient(portal.url, politeness_delay=0, max_retries=0))
    pipeline.hash_compare(db, reader, portal, run_id)
    history.clear(db, run_id)
    with pytest.raises(RuntimeError, match="10 created or updated records have no computed change"), \
            db.transaction():
        history.write_history(db, run_id, portal.url, datetime.now(timezone.utc))
    first = history.compute_changes(db, reader, run_id, portal.url, batch_size=3)
    assert history.compute_changes(db, reader, run_id, portal.url, batch_size=4) == first
    assert db.execute("SELECT count(*) FROM staging_changes WHERE run_id = %s", (run_id,)).fetchone()[0] == 10
    pipeline.abort(db, run_id, "test")
    # a failed run's leftovers are swept by the next run's compute_changes
    harvest_once(db, reader, portal)
    assert db.execute("SELECT count(*) FROM staging_changes").fetchone()[0] == 0


def test_a_hash_change_with_the_same_snapshot_refreshes_the_version(db, reader, portal, portal_server, birmingham):
    """E.g. a new text recipe: every content_hash changes, no field does. No version, no change row."""
    portal_server.set_records(birmingham[:2])
    harvest_once(db, reader, portal)
    old_recipe = "encode(sha256(convert_to('old recipe ' || content_hash, 'UTF8')), 'hex')"  # a SHA-256 still
    db.execute(f"UPDATE datasets SET content_hash = {old_recipe} WHERE source_id = %s", (birmingham[0]["id"],))
    db.execute(f"UPDATE dataset_versions SET content_hash = {old_recipe}")
    again = harvest_once(db, reader, portal)
    assert again["classified"]["updated"] == 1
    assert again["computed"]["unchanged_snapshot"] == 1 and again["computed"]["metadata_updated"] == 0
    assert again["written"] == {"versions": 0, "changes": 0, "refreshed": 1, "snapshots_dropped": 0,
                                "last_seen_cleared": 0}
    (version,) = versions_of(db, birmingham[0]["id"])
    assert version[5] == db.execute("SELECT content_hash FROM datasets WHERE source_id = %s",
                                    (birmingham[0]["id"],)).fetchone()[0]
    assert version[4] == again["seen_at"]


def test_datasets_harvested_before_history_get_a_version(db, reader, portal, portal_server, birmingham):
    portal_server.set_records(birmingham[:3])
    harvest_once(db, reader, portal)
    db.execute("DELETE FROM dataset_versions")  # as if harvested before sql/003 (changes go with them)
    portal_server.upsert_record(edited(birmingham[1], title="Edited after the upgrade"))
    later = harvest_once(db, reader, portal)
    assert later["computed"]["baseline"] == 2 and later["computed"]["title_changed"] == 1
    assert changes_of(db, later["run_id"])[0][1:4] == ("title_changed", None, 1)
    assert [v[:3] for v in versions_of(db, birmingham[0]["id"])] == [(1, True, "new")]
    assert [v[:3] for v in versions_of(db, birmingham[1]["id"])] == [(1, True, "title_changed")]
    assert db.execute("SELECT count(*) FROM dataset_changes").fetchone()[0] == 1
    assert_one_current_version_each(db)


def test_views(db, reader, portal, portal_server, birmingham):
    portal_server.set_records(birmingham[:3])
    harvest_once(db, reader, portal)
    portal_server.remove_record(birmingham[2]["id"])
    harvest_once(db, reader, portal, force=True)
    current = db.execute("SELECT source_id, version_number, title, portal_url FROM current_datasets"
                         " ORDER BY source_id").fetchall()
    assert current == sorted((r["id"], 1, r["title"], portal.url) for r in birmingham[:2])
    recent = db.execute("SELECT change_type, title, url, portal_url, portal_name FROM recent_dataset_changes"
                        " LIMIT 1").fetchone()
    assert recent == ("removed", birmingham[2]["title"], f"{portal.url}/dataset/{birmingham[2]['name']}",
                      portal.url, PORTAL)


# -- the current version's snapshot: the dataset's row (sql/031, 032) -----------------------------
def stored(db, source_id):
    """{version_number: (is_current, the snapshot column as stored)}."""
    return {n: (current, snapshot) for n, current, snapshot in db.execute(
        "SELECT v.version_number, v.is_current, v.snapshot FROM dataset_versions v JOIN datasets d"
        " ON d.id = v.dataset_id WHERE d.source_id = %s ORDER BY 1", (source_id,))}


def test_the_current_version_stores_no_snapshot_and_the_replaced_one_takes_its_own(
        db, reader, portal, portal_server, birmingham):
    portal_server.set_records(birmingham)
    harvest_once(db, reader, portal)
    # after a first sync: no snapshot stored at all, and the readers build it from the row
    assert db.execute("SELECT count(*), count(snapshot) FROM dataset_versions").fetchone() == (10, 0)
    target = birmingham[0]
    first = history.get_version(db, dataset_id(db, target["id"]), 1)
    row = db.execute("SELECT title, description, raw FROM datasets WHERE source_id = %s", (target["id"],)).fetchone()
    assert first["snapshot"] == ch.snapshot(*row) and first["snapshot"]["name"] == target["name"]
    assert (first["title"], first["description"]) == row[:2]

    portal_server.upsert_record(edited(target, title="Card spending", notes="Rewritten entirely.",
                                       tags=target["tags"] + [{"name": "refunds"}]))
    second = harvest_once(db, reader, portal)
    assert second["written"]["versions"] == 1
    # the replaced version holds exactly the snapshot the readers gave it while it was current
    assert stored(db, target["id"]) == {1: (False, first["snapshot"]), 2: (True, None)}
    versions = history.list_versions(db, dataset_id(db, target["id"]))
    assert [(v["version_number"], v["title"]) for v in versions] == [(2, "Card spending"), (1, target["title"])]
    assert versions[1]["snapshot"] == first["snapshot"]
    assert versions[0]["snapshot"]["description"] == "Rewritten entirely."
    # the diff reads both, as before: exactly the fields that changed
    changed = {f["field"] for f in diff.field_changes(versions[1]["snapshot"], versions[0]["snapshot"])
               if f["changed"]}
    assert changed == {"title", "description", "tags"}
    # SQL: v.title of either version, the view from the dataset's row; only current versions lack one
    assert db.execute("SELECT v.version_number, v.title FROM dataset_versions v JOIN datasets d ON d.id = v.dataset_id"
                      " WHERE d.source_id = %s ORDER BY 1", (target["id"],)).fetchall() == [
        (1, target["title"]), (2, "Card spending")]
    assert db.execute("SELECT version_number, title, description FROM current_datasets WHERE source_id = %s",
                      (target["id"],)).fetchone() == (2, "Card spending", "Rewritten entirely.")
    assert db.execute("SELECT count(*) FROM dataset_versions WHERE snapshot IS NULL AND NOT is_current"
                      ).fetchone()[0] == 0
    # a version that is not current must hold its snapshot (the schema says so)
    try:
        db.execute("UPDATE dataset_versions SET snapshot = NULL WHERE version_number = 1 AND NOT is_current")
    except psycopg.errors.CheckViolation:
        pass
    else:
        raise AssertionError("a replaced version lost its snapshot without a CheckViolation")


def test_a_stored_current_snapshot_is_kept_unless_a_run_proves_it_equal_to_the_rows(
        db, reader, portal, portal_server, birmingham):
    """As a database harvested before 031 holds them: every current version with its snapshot. One
    of them differs from what its row gives today (tracked_metadata changed since it was stored)."""
    portal_server.set_records(birmingham[:3])
    harvest_once(db, reader, portal)
    same, differs, edited_later = birmingham[0], birmingham[1], birmingham[2]
    for rec in (same, differs, edited_later):
        snapshot = history.get_version(db, dataset_id(db, rec["id"]), 1)["snapshot"]  # (the row's)
        if rec is differs:
            snapshot["fields"]["tracked_then"] = "a field today's tracked_metadata no longer keeps"
        db.execute("UPDATE dataset_versions SET snapshot = %s WHERE dataset_id = %s AND is_current",
                   (as_jsonb(snapshot), dataset_id(db, rec["id"])))
    kept = stored(db, differs["id"])[1][1]
    # the readers prefer what is stored
    assert history.get_version(db, dataset_id(db, differs["id"]), 1)["snapshot"] == kept

    portal_server.upsert_record(edited(edited_later, title=edited_later["title"] + " (revised)"))
    run = harvest_once(db, reader, portal)
    assert run["computed"]["snapshots_dropped"] == 1 and run["written"]["snapshots_dropped"] == 1
    assert run["computed"]["title_changed"] == 1
    assert stored(db, same["id"]) == {1: (True, None)}  # proven equal: dropped, its readers see the same
    assert stored(db, differs["id"]) == {1: (True, kept)}  # differs: kept, and what the readers show
    assert history.get_version(db, dataset_id(db, differs["id"]), 1)["snapshot"] == kept
    # the replaced version kept the snapshot it stored; the change was detected against it
    assert stored(db, edited_later["id"])[1][1]["title"] == edited_later["title"]
    assert stored(db, edited_later["id"])[2] == (True, None)
    # and the kept one, when its dataset changes, is what its replaced version holds and compares from
    portal_server.upsert_record(edited(differs, notes="New notes."))
    later = harvest_once(db, reader, portal)
    assert later["computed"]["content_updated"] == 1 and later["computed"]["snapshots_dropped"] == 0
    assert stored(db, differs["id"]) == {1: (False, kept), 2: (True, None)}
    change = db.execute("SELECT changed_fields FROM dataset_changes c JOIN datasets d ON d.id = c.dataset_id"
                        " WHERE d.source_id = %s AND c.run_id = %s", (differs["id"], later["run_id"])).fetchone()[0]
    assert "tracked_then" in change["fields"] and "description" in change


# -- the commands ------------------------------------------------------------------------------
@pytest.fixture
def history_of_three_runs(db, reader, portal, portal_server, birmingham):
    """Run 1: 10 new. Run 2: a big edit (review) and a tag. Run 3: one dataset removed."""
    portal_server.set_records(birmingham)
    harvest_once(db, reader, portal)
    portal_server.upsert_record(edited(birmingham[0], title="Card spending", notes="Rewritten entirely."))
    portal_server.upsert_record(edited(birmingham[1], tags=birmingham[1]["tags"] + [{"name": "refunds"}]))
    harvest_once(db, reader, portal)
    portal_server.remove_record(birmingham[9]["id"])
    harvest_once(db, reader, portal)
    return birmingham


def test_changes_command(database_url, history_of_three_runs, portal, capsys):
    records = history_of_three_runs
    assert cli("changes", "-p", PORTAL, "--limit", "3") == 0
    out = capsys.readouterr().out
    assert "[1] REMOVED\n" in out and "(REVIEW)" in out
    assert "[2] CONTENT_UPDATED (REVIEW)" in out or "[3] CONTENT_UPDATED (REVIEW)" in out
    assert "[2] METADATA_UPDATED\n" in out or "[3] METADATA_UPDATED\n" in out
    assert "[4]" not in out
    assert "Card spending" in out and f"{portal.url}/dataset/{records[0]['name']}" in out
    assert "significance: 90%" in out and "significance: 50%" in out and "significance: 0%" in out
    assert "Version 1 -> 2" in out and "Version 1 -> 1" in out
    assert "title; description (" in out and "tags +1" in out and "removed from the portal" in out

    assert cli("changes", "-p", PORTAL, "--review", "--json") == 0
    (only,) = json.loads(capsys.readouterr().out)
    assert (only["n"], only["change_type"], only["requires_review"], only["significance"]) == \
        (1, "content_updated", True, 0.9)
    assert (only["old_version"], only["new_version"], only["source_id"]) == (1, 2, records[0]["id"])
    assert only["summary"].startswith("title; description")
    assert set(only["changed_fields"]) == {"title", "description"}

    assert cli("changes", "-p", PORTAL, "--json", "--limit", "100") == 0
    assert len(json.loads(capsys.readouterr().out)) == 13
    tomorrow = (datetime.now(timezone.utc) + timedelta(days=1)).date().isoformat()
    assert cli("changes", "-p", PORTAL, "--since", tomorrow) == 0
    assert "no changes in hist since" in capsys.readouterr().out


def test_versions_command(database_url, history_of_three_runs, portal, capsys):
    record = history_of_three_runs[0]
    url = f"{portal.url}/dataset/{record['name']}"
    assert cli("versions", "-p", PORTAL, "-u", url, "--json") == 0
    listed = json.loads(capsys.readouterr().out)
    assert listed["dataset"]["source_id"] == record["id"]
    assert [(v["version_number"], v["is_current"], v["change_type"]) for v in listed["versions"]] == [
        (2, True, "content_updated"), (1, False, "new")]
    assert set(listed["versions"][0]["changed_fields"]) == {"title", "description"}

    assert cli("versions", "-p", PORTAL, "--id", record["id"]) == 0
    out = capsys.readouterr().out
    assert "2 (current)" in out and "content_updated" in out and "first version" in out
    content_hash = listed["versions"][0]["content_hash"]
    assert content_hash[:10] in out and content_hash[:11] not in out
    # the URL is compared normalized: host case and a trailing slash do not matter
    assert cli("versions", "-p", PORTAL, "-u", url.replace("http://", "HTTP://") + "/", "--json") == 0
    assert json.loads(capsys.readouterr().out)["dataset"]["source_id"] == record["id"]
    with pytest.raises(LookupError, match="no dataset with url"):
        cli("versions", "-p", PORTAL, "-u", f"{portal.url}/dataset/nope")


def test_diff_command(database_url, history_of_three_runs, portal, capsys):
    record = history_of_three_runs[0]
    url = f"{portal.url}/dataset/{record['name']}"
    assert cli("diff", "-p", PORTAL, "-u", url) == 0
    out = capsys.readouterr().out
    assert "--- version 1 (new, first seen" in out and "+++ version 2 (content_updated, first seen" in out
    assert f"-title: {record['title']}\n" in out and "+title: Card spending\n" in out
    assert "+  Rewritten entirely.\n" in out
    assert "tags[]" not in out  # unchanged metadata is context at most, and far from the edit here

    tagged = history_of_three_runs[1]
    assert cli("diff", "-p", PORTAL, "--id", tagged["id"], "--from", "1", "--to", "2", "--json") == 0
    diff = json.loads(capsys.readouterr().out)["diff"]
    assert '+tags[]: "refunds"' in diff and not [line for line in diff[2:] if line.startswith("-")]

    assert cli("diff", "-p", PORTAL, "--id", history_of_three_runs[5]["id"]) == 0
    assert "has only version 1" in capsys.readouterr().out
    with pytest.raises(LookupError, match="has no version 6 or 7 \\(versions 1 to 2 exist\\)"):
        cli("diff", "-p", PORTAL, "-u", url, "--to", "7")


def test_purge_command(db, history_of_three_runs, portal, capsys):
    gone = history_of_three_runs[9]["id"]
    yesterday = (datetime.now(timezone.utc) - timedelta(days=1)).date().isoformat()
    tomorrow = (datetime.now(timezone.utc) + timedelta(days=1)).date().isoformat()
    assert cli("purge", "--portal", PORTAL, "--removed-before", yesterday, "--dry-run") == 0
    assert capsys.readouterr().out.startswith("would purge 0 datasets of hist")
    assert cli("purge", "-p", PORTAL, "--removed-before", tomorrow, "--dry-run", "--json") == 0
    assert {k: v for k, v in json.loads(capsys.readouterr().out).items() if k in ("datasets", "versions", "changes",
            "dry_run")} == {"datasets": 1, "versions": 1, "changes": 2, "dry_run": True}
    assert db.execute("SELECT count(*) FROM datasets WHERE source_id = %s", (gone,)).fetchone()[0] == 1

    assert cli("purge", "--portal", PORTAL, "--removed-before", tomorrow) == 0
    assert capsys.readouterr().out.startswith("purged 1 datasets of hist removed before")
    assert db.execute("SELECT count(*) FROM datasets WHERE source_id = %s", (gone,)).fetchone()[0] == 0
    assert db.execute("SELECT count(*) FROM datasets").fetchone()[0] == 9
    assert db.execute("SELECT count(*) FROM dataset_versions").fetchone()[0] == 9 + 2
    assert db.execute("SELECT count(*) FROM dataset_changes").fetchone()[0] == 13 - 2
    assert_one_current_version_each(db)
