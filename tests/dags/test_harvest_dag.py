"""harvest_<portal> end to end through real Airflow (dag.test()), real HTTP to the local CKAN portal
and a real PostgreSQL with pgvector."""
import copy
import json
import math

import pytest

GC_BEFORE = "data-gc-ca-snapshot-2013-06-17T11-50.jsonl"
GC_AFTER = "data-gc-ca-snapshot-2013-06-17T12-30.jsonl"
BIRMINGHAM = "data-birmingham-gov-uk.jsonl"
HUMDATA = "data-humdata-org.jsonl"


def runs(db):
    return db.execute("SELECT run_id, mode, status, stats, started_at, error FROM sync_runs ORDER BY run_id").fetchall()


def reconcile_reason(db, run_id):
    return db.execute("SELECT reconcile_reason FROM sync_runs WHERE run_id = %s", (run_id,)).fetchone()[0]


def last_stats(db):
    return runs(db)[-1][3]


def watermark(db):
    row = db.execute("SELECT last_successful_sync, last_sync_mode, sync_status, datasets_synced"
                     " FROM portal_sync_status").fetchone()
    return row


def snapshot(db):
    """Everything users see of datasets, for before/after comparisons."""
    return db.execute("SELECT d.source_id, d.content_hash, d.metadata_hash, d.embedded_content_hash, d.updated_at,"
                      " greatest(d.updated_at, k.last_seen_at), d.removed_at"
                      " FROM datasets d LEFT JOIN dataset_seen k ON k.dataset_id = d.id ORDER BY d.source_id").fetchall()


def distinct_texts(db):
    return db.execute("SELECT count(DISTINCT content_hash) FROM datasets").fetchone()[0]


def test_full_sync_then_incremental_with_no_change(harvest, portal_server, db, samples):
    portal_server.set_records(samples(HUMDATA))
    harvest.configure(portal_server.base_url)

    assert harvest.run(full_sync=True).state == "success"
    (run_id, mode, status, stats, started_at, _), = runs(db)
    assert (mode, status) == ("full", "committed")
    n = len(samples(HUMDATA))
    texts = distinct_texts(db)
    assert stats["fetched"] == stats["created"] == n
    assert stats["updated"] == stats["unchanged"] == stats["failed"] == stats["skipped"] == 0
    assert stats["embedded"] == texts and stats["embedding_requests"] == math.ceil(texts / 64)
    assert stats["portal_requests"] >= 1
    assert db.execute("SELECT count(*) FROM datasets WHERE embedded_content_hash = content_hash").fetchone()[0] == n
    assert db.execute("SELECT count(*) FROM embeddings").fetchone()[0] == texts
    assert db.execute("SELECT count(*) FROM staging_records").fetchone()[0] == 0
    assert watermark(db)[:3] == (started_at, "full", "completed")

    before = snapshot(db)
    portal_server.requests.clear()
    assert harvest.run().state == "success"
    second = runs(db)[-1]
    assert (second[1], second[2]) == ("incremental", "committed")
    stats = second[3]
    assert stats["created"] == stats["updated"] == 0
    assert stats["embedding_requests"] == stats["embedded"] == 0
    # Only what was modified since the watermark (minus the lookback) was asked for, plus one request
    # for the portal's count, which matches ours: no reconciliation.
    listing, count = [params for action, params in portal_server.requests if action == "package_search"]
    assert "metadata_modified:[" in listing["fq"] and "fl" not in listing
    assert count["rows"] == "0" and "fq" not in count
    assert stats["fetched"] == 0 and stats["portal_requests"] == 2 and stats["portal_count"] == n
    assert "reconcile_listed" not in stats and reconcile_reason(db, second[0]) is None
    assert [(r[0], r[1], r[2], r[3]) for r in snapshot(db)] == [(r[0], r[1], r[2], r[3]) for r in before]
    assert watermark(db)[:2] == (second[4], "incremental")


def test_title_change_re_embeds_exactly_that_dataset(harvest, portal_server, db, samples):
    records = samples(BIRMINGHAM)
    portal_server.set_records(records)
    harvest.configure(portal_server.base_url)
    assert harvest.run().state == "success"
    old_hash = db.execute("SELECT content_hash FROM datasets WHERE source_id = %s", (records[3]["id"],)).fetchone()[0]

    changed = copy.deepcopy(records[3])
    changed["title"] = "Purchase card transactions, corrected"
    changed["metadata_modified"] = "2030-01-01T00:00:00.000001"
    portal_server.upsert_record(changed)
    assert harvest.run().state == "success"
    stats = last_stats(db)
    assert (stats["fetched"], stats["updated"], stats["created"]) == (1, 1, 0)
    assert (stats["embedding_requests"], stats["embedded"]) == (1, 1)
    title, content_hash, embedded = db.execute(
        "SELECT title, content_hash, embedded_content_hash FROM datasets WHERE source_id = %s",
        (changed["id"],)).fetchone()
    assert title == "Purchase card transactions, corrected"
    assert content_hash != old_hash and embedded == content_hash
    # Its vector is of the new text: the old vector is no longer linked to it.
    assert db.execute("SELECT count(*) FROM embeddings WHERE content_hash = decode(%s, 'hex')",
                      (content_hash,)).fetchone()[0] == 1


def test_tag_change_updates_without_embedding(harvest, portal_server, db, samples):
    records = samples(BIRMINGHAM)
    portal_server.set_records(records)
    harvest.configure(portal_server.base_url)
    assert harvest.run().state == "success"
    before = dict(db.execute("SELECT source_id, metadata_hash FROM datasets").fetchall())

    changed = copy.deepcopy(records[0])
    changed["tags"] = changed["tags"] + [{"name": "procurement", "display_name": "procurement"}]
    changed["metadata_modified"] = "2030-01-01T00:00:00"
    portal_server.upsert_record(changed)
    assert harvest.run().state == "success"
    stats = last_stats(db)
    assert (stats["updated"], stats["embedding_requests"], stats["embedded"]) == (1, 0, 0)
    tags, metadata_hash, content_hash, embedded = db.execute(
        "SELECT tags, metadata_hash, content_hash, embedded_content_hash FROM datasets WHERE source_id = %s",
        (changed["id"],)).fetchone()
    assert "procurement" in tags and metadata_hash != before[changed["id"]] and embedded == content_hash


def test_data_gc_ca_snapshot_pair(harvest, portal_server, db, samples):
    """The real portal, 40 minutes apart: 12 datasets added, 6 changed only in their resources."""
    portal_server.set_records(samples(GC_BEFORE))
    harvest.configure(portal_server.base_url)
    assert harvest.run(full_sync=True).state == "success"
    assert last_stats(db)["created"] == 489
    embeddings_before = db.execute("SELECT count(*) FROM embeddings").fetchone()[0]

    portal_server.set_records(samples(GC_AFTER))
    assert harvest.run(full_sync=True).state == "success"
    stats = last_stats(db)
    assert (stats["fetched"], stats["created"], stats["updated"], stats["unchanged"]) == (501, 12, 6, 483)
    new_texts = db.execute("SELECT count(*) FROM embeddings").fetchone()[0] - embeddings_before
    assert stats["embedded"] == new_texts <= 12
    assert db.execute("SELECT count(*) FROM datasets").fetchone()[0] == 501

    before = {r["id"]: r for r in samples(GC_BEFORE)}
    updated = [r for r in samples(GC_AFTER) if r["id"] in before and r != before[r["id"]]]
    assert len(updated) == 6
    changes = db.execute(
        "SELECT d.source_id, c.change_type, c.changed_fields, c.old_version, c.new_version FROM dataset_changes c"
        " JOIN datasets d ON d.id = c.dataset_id WHERE c.run_id = (SELECT max(run_id) FROM sync_runs)").fetchall()
    assert sorted(c[1] for c in changes) == ["metadata_updated"] * 6 + ["new"] * 12
    for source_id, change_type, fields, old, new in changes:
        if change_type == "metadata_updated":
            assert source_id in {r["id"] for r in updated}
            assert set(fields) == {"resources"} and fields["resources"]["changed"] and (old, new) == (1, 2)
    assert stats["removed"] == 0
    for rec in updated:
        fmt = db.execute("SELECT raw->'resources' FROM datasets WHERE source_id = %s", (rec["id"],)).fetchone()[0]
        assert [r["format"] for r in fmt] == [r["format"] for r in rec["resources"]]


def test_failing_portal_leaves_watermark_and_datasets_untouched(harvest, portal_server, db, samples):
    records = samples(BIRMINGHAM)
    portal_server.set_records(records)
    harvest.configure(portal_server.base_url, max_retries=1)
    assert harvest.run().state == "success"
    before_datasets, before_status = snapshot(db), watermark(db)

    changed = copy.deepcopy(records[0])
    changed["title"] = "A change that must not land"
    changed["metadata_modified"] = "2030-01-01T00:00:00"
    portal_server.upsert_record(changed)
    portal_server.fail_actions = {"package_search": 500}
    assert harvest.run().state == "failed"

    run_id, mode, status, stats, _, error = runs(db)[-1]
    assert status == "failed" and "PortalUnavailable" in error
    assert snapshot(db) == before_datasets
    assert watermark(db)[0] == before_status[0] and watermark(db)[2] == "failed"
    assert db.execute("SELECT count(*) FROM staging_records").fetchone()[0] == 0

    # The portal is back: the next run picks the change up from the same watermark.
    portal_server.fail_actions = set()
    assert harvest.run().state == "success"
    assert last_stats(db)["updated"] == 1


def test_record_without_id_is_failed_and_the_run_goes_on(harvest, portal_server, db, samples):
    records = samples(BIRMINGHAM)
    broken = copy.deepcopy(records[1])
    del broken["id"]
    broken["name"] = "no-id-here"
    portal_server.set_records(records[2:] + [broken])
    harvest.configure(portal_server.base_url)
    assert harvest.run().state == "success"
    stats = last_stats(db)
    assert (stats["failed"], stats["created"], stats["fetched"]) == (1, len(records) - 2, len(records) - 2)
    assert db.execute("SELECT count(*) FROM datasets").fetchone()[0] == len(records) - 2


def test_rejected_filter_falls_back_to_full_sync(harvest, portal_server, db, samples):
    records = samples(BIRMINGHAM)
    portal_server.set_records(records)
    harvest.configure(portal_server.base_url)
    assert harvest.run().state == "success"
    portal_server.reject_fq = True
    assert harvest.run().state == "success"
    _, mode, status, stats, _, _ = runs(db)[-1]
    assert (mode, status) == ("full", "committed")
    assert (stats["fetched"], stats["unchanged"], stats["embedded"]) == (len(records), len(records), 0)


def test_a_full_listing_cut_by_a_repeated_page_removes_nothing(harvest, portal_server, db, samples, caplog):
    import logging

    portal_server.set_records(samples(GC_AFTER))
    harvest.configure(portal_server.base_url, page_size=50)
    assert harvest.run(full_sync=True).state == "success"
    n = len(samples(GC_AFTER))
    assert n > 100 and db.execute("SELECT count(*) FROM datasets WHERE removed_at IS NULL").fetchone()[0] == n
    first = {}

    def first_page_always(action, params):  # a cache answering every listing request with the first page
        if action == "package_search" and params.get("rows") != "0":
            if not first:
                first.update(params)
            else:
                params.clear()
                params.update(first)

    portal_server.on_request = first_page_always
    caplog.set_level(logging.WARNING, logger="harvester")
    assert harvest.run(full_sync=True).state == "success"
    run_id, mode, status, stats, _, _ = runs(db)[-1]
    # 50 of the catalogue's datasets listed, the rest never reached: none removed, the run incremental
    assert (mode, status, stats["fetched"], stats["removed"]) == ("incremental", "committed", 50, 0)
    assert "repeats the page before it" in caplog.text and "was cut short" in caplog.text
    assert db.execute("SELECT count(*) FROM datasets WHERE removed_at IS NULL").fetchone()[0] == n
    assert watermark(db)[1] == "incremental"


@pytest.mark.parametrize("fault", ["html_page", "ckan_error"])
def test_failed_incremental_request_fails_the_run_without_a_full_sync(harvest, portal_server, db, samples, fault):
    """Only a refused or ignored filter may turn an incremental run into a full sync (which lists the
    whole portal and removes what it no longer lists): an HTML page where CKAN's answer should be
    (retried first, like a 5xx) or another CKAN error fails the run, and the watermark stays."""
    records = samples(BIRMINGHAM)
    portal_server.set_records(records)
    harvest.configure(portal_server.base_url, max_retries=1)
    assert harvest.run().state == "success"
    before_datasets, before_status = snapshot(db), watermark(db)
    portal_server.remove_record(records[0]["id"])  # a full sync would mark it removed
    portal_server.requests.clear()
    if fault == "html_page":  # a proxy's page with status 200, on the first try and on the retry
        portal_server.fail_next(2, 200, action="package_search")
    else:
        portal_server.fail_next(1, 403, action="package_search", body={
            "help": "x", "success": False, "error": {"__type": "Authorization Error", "message": "Access denied"}})
    assert harvest.run().state == "failed"

    run_id, mode, status, stats, _, error = runs(db)[-1]
    assert (mode, status) == ("incremental", "failed")
    if fault == "html_page":
        assert "PortalUnavailable" in error and "portal unavailable after 2 attempts (last: HTTP 200, not a JSON " \
                                               "answer (text/html" in error
    else:
        assert "CkanError" in error and "package_search: HTTP 403 Authorization Error: Access denied" in error
    searches = [params for action, params in portal_server.requests if action == "package_search"]
    assert len(searches) == (2 if fault == "html_page" else 1)
    assert all("metadata_modified:[" in params.get("fq", "") for params in searches)  # no full listing
    assert snapshot(db) == before_datasets  # nothing removed, nothing changed
    assert watermark(db)[0] == before_status[0] and watermark(db)[2] == "failed"


def test_xcom_carries_counts_and_run_ids_only(harvest, portal_server, db, samples):
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    portal_server.set_records(samples(BIRMINGHAM))
    harvest.configure(portal_server.base_url)
    dag_run = harvest.run()
    assert dag_run.state == "success"
    with create_session() as session:
        rows = session.query(XComModel).filter(XComModel.run_id == dag_run.run_id).all()
        values = [XComModel.deserialize_value(x) for x in rows]
    assert len(values) == 6   # begin, fetch_modified, reconcile, hash_compare, embed_changed, upsert
    for value in values:
        for item in value if isinstance(value, list) else [value]:
            assert isinstance(item, dict) and "run_id" in item
            assert all(isinstance(v, int) or k == "mode" for k, v in item.items()), item


def test_datasets_synced_is_the_number_of_live_datasets_held(harvest, portal_server, db, samples):
    def live():
        return db.execute("SELECT count(*) FROM datasets WHERE removed_at IS NULL").fetchone()[0]

    records = samples(BIRMINGHAM)
    portal_server.set_records(records)
    harvest.configure(portal_server.base_url)
    assert harvest.run(full_sync=True).state == "success"
    assert watermark(db)[3] == live() == len(records)

    assert harvest.run().state == "success"        # a quiet incremental run: nothing fetched
    assert last_stats(db)["fetched"] == 0
    assert watermark(db)[3] == live() == len(records)

    portal_server.set_records(records[1:])         # one dataset gone: the full sync removes it
    assert harvest.run(full_sync=True).state == "success"
    assert last_stats(db)["removed"] == 1
    assert watermark(db)[3] == live() == len(records) - 1
