"""After a run that changed a large share of the datasets (a first sync, a big re-sync), its upsert
analyzes the tables it wrote, so that the next run's statements and the searches are planned for
their new size (at 1,000,000 datasets an incremental run planned on an empty table's statistics
spent minutes on one count: bench/scale_bench.py). Real PostgreSQL, the local CKAN portal, the
local Gemini-protocol server."""
from __future__ import annotations

import copy
import logging
from datetime import datetime, timedelta, timezone

from harvester.config.portals import Portal
from harvester.embeddings import get_provider
from harvester.pipeline import steps as pipeline
from harvester.store import datasets
from harvester.testing.samples import distinct_records


def estimated_rows(db) -> dict[str, float]:
    """pg_class.reltuples of each table the upsert may analyze: -1 until ANALYZE (or VACUUM) ran."""
    return dict(db.execute("SELECT relname, reltuples FROM pg_class WHERE relname = ANY(%s)",
                           (list(datasets.ANALYZED_AFTER_BULK),)).fetchall())


def test_a_bulk_run_leaves_statistics_and_a_small_one_does_not(db, reader, portal_server, samples, gemini,
                                                               monkeypatch, caplog):
    # the thresholds scaled down with the portal (10,000 datasets and a tenth of the table by default)
    monkeypatch.setattr(datasets, "ANALYZE_MIN_ROWS", 20)
    records = distinct_records(samples, 30)
    portal_server.set_records(records)
    portal = Portal(name="p", url=portal_server.base_url, politeness_delay=0)
    provider = get_provider()
    assert set(estimated_rows(db).values()) == {-1}  # a new database: no statistics anywhere

    with caplog.at_level(logging.INFO, logger="harvester.pipeline.steps"):
        pipeline.harvest(db, reader, portal, pipeline.source_for(portal), provider)
    rows = estimated_rows(db)
    assert rows["datasets"] == rows["dataset_search"] == rows["dataset_versions"] == rows["dataset_vectors"] == 30
    assert rows["embeddings"] == 30 and rows["dataset_changes"] == 30
    assert any("fresh statistics after 30 changed datasets: analyzed datasets, dataset_search" in r.getMessage()
               for r in caplog.records)
    # datasets vacuumed too: its pages marked all-visible, so the next run's counts of live datasets
    # read the index alone (issue 40: until autovacuum came, each read every row, 0.5 s at 1M)
    pages, visible = db.execute("SELECT relpages, relallvisible FROM pg_class WHERE relname = 'datasets'").fetchone()
    assert pages > 0 and visible == pages
    plan = "\n".join(r[0] for r in db.execute(
        "EXPLAIN (ANALYZE, COSTS OFF) SELECT count(*) FROM datasets WHERE portal_url = %s AND removed_at IS NULL",
        (portal.url,)).fetchall())
    assert "Index Only Scan" not in plan or "Heap Fetches: 0" in plan

    # Two edits: under ANALYZE_MIN_ROWS, nothing analyzed (the statistics still say 30 versions).
    later = (datetime.now(timezone.utc) + timedelta(minutes=5)).strftime("%Y-%m-%dT%H:%M:%S.%f")
    for rec in records[:2]:
        edited = copy.deepcopy(rec)
        edited["title"] += " (revised)"
        edited["metadata_modified"] = later
        portal_server.upsert_record(edited)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="harvester.pipeline.steps"):
        assert pipeline.harvest(db, reader, portal, pipeline.source_for(portal), provider)["updated"] == 2
    assert estimated_rows(db)["dataset_versions"] == 30
    assert not any("fresh statistics" in r.getMessage() for r in caplog.records)

    # Above the minimum but under a tenth of what the statistics say the table holds: not analyzed.
    monkeypatch.setattr(datasets, "ANALYZE_MIN_ROWS", 1)
    assert datasets.analyze_after_bulk(db, 2) == []
    assert datasets.analyze_after_bulk(db, 3) == list(datasets.ANALYZED_AFTER_BULK)
    assert estimated_rows(db)["dataset_versions"] == 32


def test_a_table_someone_else_holds_is_left_to_them(db, database_url):
    """SKIP_LOCKED: a concurrent build, vacuum or analyze of a table is not waited for."""
    import psycopg

    with psycopg.connect(database_url) as other:  # a transaction holding what VACUUM and ANALYZE take
        other.execute("LOCK TABLE embeddings IN SHARE UPDATE EXCLUSIVE MODE")
        assert datasets.analyze_after_bulk(db, 100_000) == [t for t in datasets.ANALYZED_AFTER_BULK
                                                            if t != "embeddings"]


def test_looking_for_pending_texts_goes_through_the_partial_index(db, reader, portal_server, samples, gemini):
    """PostgreSQL estimates the pending condition (two columns compared) at nearly every row; on a
    checked portal the lookup goes through datasets_pending instead of a scan of the whole table,
    and the session's setting is as it was afterwards."""
    from harvester.store import vectors

    portal_server.set_records(distinct_records(samples, 12))
    portal = Portal(name="p", url=portal_server.base_url, politeness_delay=0)
    provider = get_provider()
    pipeline.harvest(db, reader, portal, pipeline.source_for(portal), provider)
    assert vectors.copies_checked(db, portal.url, provider.model)
    seen = []

    def plans(conn):
        seen.append(conn.execute("SELECT current_setting('enable_seqscan')").fetchone()[0])

    with vectors._through_pending_index(db, True):
        plans(db)
    plans(db)
    with vectors._through_pending_index(db, False):
        plans(db)
    assert seen == ["off", "on", "on"]
    assert vectors.count_pending(db, 0, portal.url, provider.model) == 0
    assert db.execute("SHOW enable_seqscan").fetchone()[0] == "on"


def test_a_first_sync_writes_each_dataset_once_and_notes_the_portals_language(db, reader, portal_server, samples,
                                                                              gemini):
    """When the upsert checks every copy of the portal's vectors after the merge (a first sync), the
    merge inserts new datasets already linked to their vector: no update of every row just written
    (51 s at 1,000,000, issue 40) and no dead row version left behind. The commit notes the
    text-search configuration the datasets were indexed with, so the next run does not look for
    datasets indexed otherwise among all of them."""
    from harvester.store import runs, vectors

    portal_server.set_records(distinct_records(samples, 12))
    portal = Portal(name="p", url=portal_server.base_url, politeness_delay=0)
    provider = get_provider()
    source = pipeline.source_for(portal)
    run_id = pipeline.begin(db, portal, full_sync=True)["run_id"]
    pipeline.fetch_modified(db, portal, run_id, source)
    pipeline.hash_compare(db, reader, portal, run_id, provider.model)
    pipeline.embed_changed(db, reader, portal, run_id, provider)
    started = runs.get(db, run_id).started_at
    with db.transaction(force_rollback=True):
        datasets.merge(db, run_id, portal.url, started, provider.model, portal.language, prelink=True)
        assert db.execute("SELECT pg_stat_get_xact_tuples_updated('datasets'::regclass)").fetchone()[0] == 0
        assert db.execute("SELECT count(*) FILTER (WHERE embedded_content_hash = content_hash), count(*)"
                          " FROM datasets").fetchone() == (12, 12)
        vectors.copy_for_search(db, portal.url, provider.model)
        assert db.execute("SELECT count(*) FROM dataset_vectors").fetchone()[0] == 12
    with db.transaction(force_rollback=True):  # (without: linked after, each row written twice)
        datasets.merge(db, run_id, portal.url, started, provider.model, portal.language)
        assert db.execute("SELECT pg_stat_get_xact_tuples_updated('datasets'::regclass)").fetchone()[0] == 12

    pipeline.upsert(db, portal, run_id, provider.model, provider.max_batch)
    assert db.execute("SELECT count(*) FROM dataset_vectors").fetchone()[0] == 12
    assert db.execute("SELECT search_config::text FROM portal_sync_status").fetchone()[0] == portal.language
