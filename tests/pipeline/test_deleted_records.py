"""Records a portal says it deleted (an OAI-PMH header with status="deleted", domain/dataset.py
``deletion``) are removals, on an incremental run too: staged apart (store/deletions.py, sql/026),
removed at upsert through history.apply_removals under the removal guard, with a ``removed``
change like any other removal. Driven by the real pipeline steps on a real PostgreSQL; the source
is a stand-in portal that yields the pages it is given (as tests/pipeline/test_read_ahead.py's)."""
from __future__ import annotations

import pytest

from harvester.config.portals import Portal
from harvester.domain import dataset as ds
from harvester.pipeline import steps as pipeline
from harvester.sources.base import Capabilities, Listing

URL = "https://repository.example.org/oai"


def record(n: int, title: str | None = None, modified: str = "2024-01-01T00:00:00Z") -> ds.DatasetRecord:
    return ds.normalize({"id": f"r{n}", "title": title or f"Record {n}", "metadata_modified": modified}, URL)


class PagesSource:
    """A portal whose listing is ``pages`` (lists of records), whole when asked without ``since``."""

    kind = "test"
    capabilities = Capabilities(incremental=True)

    def __init__(self, pages: list[list[ds.DatasetRecord]]):
        self.pages = pages
        self.requests_made = self.bytes_received = 0
        self.total = None

    def iter_records(self, since, page_size: int, listing: Listing, validators=None):
        for page in self.pages:
            self.requests_made += 1
            yield page
        listing.complete = since is None


@pytest.fixture
def provider(gemini):
    from harvester.embeddings import get_provider

    return get_provider()


@pytest.fixture
def portal():
    return Portal(name="repo", url=URL, politeness_delay=0, max_retries=0, max_removal_share=0.2)


def harvest(db, reader, portal, provider, pages, **flags) -> dict:
    return pipeline.harvest(db, reader, portal, PagesSource(pages), provider, **flags)


def live(db) -> set[str]:
    return {r[0] for r in db.execute("SELECT source_id FROM datasets WHERE removed_at IS NULL")}


def test_a_deleted_record_is_removed_by_an_incremental_run(db, reader, portal, provider):
    harvest(db, reader, portal, provider, [[record(n) for n in range(10)]], full_sync=True)
    out = harvest(db, reader, portal, provider, [
        [record(5, "Record 5 edited", "2024-02-01T00:00:00Z"), ds.deletion("r3"), ds.deletion("never-held")]])
    run = db.execute("SELECT mode, stats FROM sync_runs WHERE run_id = %s", (out["run_id"],)).fetchone()
    assert run[0] == "incremental"
    assert (run[1]["fetched"], run[1]["updated"], run[1]["removed"]) == (1, 1, 1)
    assert live(db) == {f"r{n}" for n in range(10)} - {"r3"}
    changes = db.execute("SELECT d.source_id, c.change_type FROM dataset_changes c JOIN datasets d ON d.id = "
                         "c.dataset_id WHERE c.run_id = %s ORDER BY 1", (out["run_id"],)).fetchall()
    assert changes == [("r3", "removed"), ("r5", "title_changed")]
    # a deletion we never held is nothing; the staged deletions went with the run's commit
    assert db.execute("SELECT count(*) FROM datasets WHERE source_id = 'never-held'").fetchone()[0] == 0
    assert db.execute("SELECT count(*) FROM staging_deleted").fetchone()[0] == 0


def test_deletions_answer_to_the_removal_guard(db, reader, portal, provider):
    harvest(db, reader, portal, provider, [[record(n) for n in range(10)]], full_sync=True)
    out = harvest(db, reader, portal, provider, [[ds.deletion(f"r{n}") for n in range(5)]])
    stats = db.execute("SELECT stats FROM sync_runs WHERE run_id = %s", (out["run_id"],)).fetchone()[0]
    assert (stats["removed"], stats["removals_withheld"]) == (0, 5)
    assert len(live(db)) == 10
    withheld = db.execute("SELECT count(*) FROM record_outcomes WHERE run_id = %s AND code = 'removal-withheld'",
                          (out["run_id"],)).fetchone()[0]
    assert withheld == 5
    forced = harvest(db, reader, portal, provider, [[ds.deletion(f"r{n}") for n in range(5)]], force_removals=True)
    assert db.execute("SELECT stats->>'removed' FROM sync_runs WHERE run_id = %s",
                      (forced["run_id"],)).fetchone()[0] == "5"
    assert live(db) == {f"r{n}" for n in range(5, 10)}


def test_the_later_of_a_deletion_and_a_record_of_the_same_id_wins(db, reader, portal, provider):
    harvest(db, reader, portal, provider, [[record(n) for n in range(10)]], full_sync=True)
    # r1: deleted, then published again later in the listing (stays); r2: published, then deleted (goes)
    harvest(db, reader, portal, provider, [
        [ds.deletion("r1"), record(2, "Record 2 edited", "2024-02-01T00:00:00Z")],
        [record(1, "Record 1 again", "2024-02-02T00:00:00Z"), ds.deletion("r2")]])
    assert live(db) == {f"r{n}" for n in range(10)} - {"r2"}


def test_a_full_listing_removes_a_deleted_record_it_also_saw_earlier(db, reader, portal, provider):
    harvest(db, reader, portal, provider, [[record(n) for n in range(10)]], full_sync=True)
    harvest(db, reader, portal, provider, [[record(n) for n in range(10)], [ds.deletion("r4")]], full_sync=True)
    assert live(db) == {f"r{n}" for n in range(10)} - {"r4"}
