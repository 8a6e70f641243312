"""Reconciliation's store and steps on a real PostgreSQL and the local CKAN portal, below Airflow:
the upgrade of an existing database, a retried step, a failed run's staging, a portal that changes
between the listing and the fetch."""
import copy
from datetime import datetime, timedelta

import psycopg
import pytest

from harvester.pipeline import steps as pipeline
from harvester.config.portals import Portal
from harvester.store import listing, migrations, runs

BIRMINGHAM = "data-birmingham-gov-uk.jsonl"


@pytest.fixture
def portal(portal_server, samples):
    portal_server.set_records(samples(BIRMINGHAM))
    return Portal(name="p", url=portal_server.base_url, politeness_delay=0, max_retries=0)


def first_sync(db, reader, portal, provider):
    return pipeline.harvest(db, reader, portal, pipeline.source_for(portal), provider, full_sync=True)


@pytest.fixture(scope="module")
def provider():
    from harvester.embeddings.local import LocalProvider

    return LocalProvider()


def test_the_migration_records_when_existing_portals_were_last_listed_whole(empty_database_url, migrate_before):
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        migrate_before(conn, 4)                     # a database from before reconciliation
        started = conn.execute(
            "INSERT INTO sync_runs (portal_url, portal_name, mode, status) VALUES ('https://p.org', 'p', 'full',"
            " 'committed'), ('https://p.org', 'p', 'incremental', 'committed') RETURNING started_at").fetchone()[0]
        conn.execute("INSERT INTO portal_sync_status (portal_url, portal_name, last_successful_sync, sync_status)"
                     " VALUES ('https://p.org', 'p', now(), 'completed')")
        assert migrations.migrate(conn)[0] == "004_reconciliation.sql"
        status = runs.status(conn, "https://p.org")
        assert status.last_full_sync == status.last_reconciliation == started
        assert status.listing_unusable == 0


def test_a_retried_reconciliation_starts_over_and_counts_once(db, reader, portal, portal_server, samples, provider):
    records = samples(BIRMINGHAM)
    first_sync(db, reader, portal, provider)
    late = copy.deepcopy(records[2])
    late["id"], late["name"] = "published-late", "published-late"
    portal_server.upsert_record(late)

    run_id = pipeline.begin(db, portal, reconcile=True)["run_id"]
    pipeline.fetch_modified(db, portal, run_id, pipeline.source_for(portal))
    first = pipeline.reconcile(db, portal, run_id, pipeline.source_for(portal))
    again = pipeline.reconcile(db, portal, run_id, pipeline.source_for(portal))   # the task's retry
    assert first == again and (again["reconcile_missing"], again["reconcile_fetched"]) == (1, 1)
    staged = db.execute("SELECT source_id, seq >= %s FROM staging_records WHERE run_id = %s",
                        (listing.RECONCILE_SEQ, run_id)).fetchall()
    assert staged == [("published-late", True)]
    assert db.execute("SELECT count(*) FROM staging_listing WHERE run_id = %s", (run_id,)).fetchone()[0] == 11
    pipeline.hash_compare(db, reader, portal, run_id, provider.model)
    pipeline.embed_changed(db, reader, portal, run_id, provider)
    stats = pipeline.upsert(db, portal, run_id, provider.model)
    assert (stats["created"], stats["fetched"], stats["removed"]) == (1, 1, 0)
    # both attempts' calls to the portal count: 1 incremental listing + 2 x (1 listing page + 1 fetch by id)
    assert stats["portal_requests"] == 5
    assert db.execute("SELECT count(*) FROM staging_listing").fetchone()[0] == 0


def test_a_failed_run_drops_its_listing_and_moves_nothing(db, reader, portal, portal_server, provider):
    first_sync(db, reader, portal, provider)
    before = runs.status(db, portal.url)
    run_id = pipeline.begin(db, portal, reconcile=True)["run_id"]
    pipeline.fetch_modified(db, portal, run_id, pipeline.source_for(portal))
    pipeline.reconcile(db, portal, run_id, pipeline.source_for(portal))
    assert db.execute("SELECT count(*) FROM staging_listing").fetchone()[0] == 10
    assert pipeline.abort(db, run_id, "RuntimeError: boom")
    assert db.execute("SELECT count(*) FROM staging_listing").fetchone()[0] == 0
    assert runs.status(db, portal.url) == before


def test_a_dataset_gone_between_listing_and_fetch_is_neither_fetched_nor_removed(
        db, reader, portal, portal_server, samples, provider):
    records = samples(BIRMINGHAM)
    first_sync(db, reader, portal, provider)
    modified = datetime.fromisoformat(records[5]["metadata_modified"]) + timedelta(seconds=1)
    stale = dict(records[5], title="Edited behind the lookback", metadata_modified=modified.isoformat())
    portal_server.upsert_record(stale)

    def vanish(action, params):  # deleted on the portal right after it listed it
        if action == "package_search" and str(params.get("fq", "")).startswith("id:("):
            portal_server.remove_record(stale["id"])

    portal_server.on_request = vanish
    stats = pipeline.harvest(db, reader, portal, pipeline.source_for(portal), provider, reconcile=True)
    assert (stats["reconcile_stale"], stats["reconcile_fetched"], stats["updated"], stats["removed"]) == (1, 0, 0, 0)
    assert db.execute("SELECT removed_at FROM datasets WHERE source_id = %s", (stale["id"],)).fetchone() == (None,)
    portal_server.on_request = None
    stats = pipeline.harvest(db, reader, portal, pipeline.source_for(portal), provider)   # the count notices
    assert (stats["removed"], stats["reconcile_removed"]) == (1, 1)
