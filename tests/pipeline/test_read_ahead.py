"""fetch_modified reads the source's next page while it stages the current one (sources/readahead.py):
pages in order, the source's errors raised to the caller as they are and nothing staged after them,
no thread left behind when staging stops early, the source's request counters right."""
from __future__ import annotations

import threading

import pytest

from harvester.domain import dataset as ds
from harvester.pipeline import steps as pipeline
from harvester.config.portals import Portal
from harvester.sources.base import Capabilities, Listing
from harvester.pipeline.readahead import read_ahead


def _threads(prefix: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(prefix)]


class PagedSource:
    """A source of ``pages`` pages of ``size`` records (forever when ``pages`` is None); page
    ``fail_on`` (1-based) raises ``error`` instead. Counts a request per page asked for and
    remembers whether its listing was closed."""

    kind = "test"
    capabilities = Capabilities(incremental=True)

    def __init__(self, pages: int | None, size: int = 5, fail_on: int | None = None,
                 error: Exception | None = None):
        self.pages, self.size, self.fail_on, self.error = pages, size, fail_on, error
        self.requests_made = self.bytes_received = 0
        self.total = None
        self.closed = False
        self.reader: str | None = None

    def iter_records(self, since, page_size: int, listing: Listing, validators=None):
        self.reader = threading.current_thread().name
        n = 0
        try:
            while self.pages is None or n < self.pages:
                n += 1
                self.requests_made += 1
                self.bytes_received += 100
                if n == self.fail_on:
                    raise self.error
                yield [ds.normalize({"id": f"p{n}-{i}", "title": f"Page {n} record {i}",
                                     "metadata_modified": "2024-01-01T00:00:00"}, "https://p.org")
                       for i in range(self.size)]
            listing.complete = since is None
        finally:
            self.closed = True


def _staged(db, run_id: int) -> list[str]:
    return [r[0] for r in db.execute("SELECT source_id FROM staging_records WHERE run_id = %s ORDER BY seq",
                                     (run_id,))]


def test_read_ahead_yields_every_page_in_order_and_ends_its_thread():
    with read_ahead(iter(range(50)), depth=2, name="test-read-ahead-order") as pages:
        assert list(pages) == list(range(50))
    assert not _threads("test-read-ahead-order")


def test_read_ahead_raises_the_sources_own_exception_after_the_pages_before_it():
    error = LookupError("page 3 is gone")

    def pages():
        yield 1
        yield 2
        raise error

    got = []
    with pytest.raises(LookupError) as raised:
        with read_ahead(pages(), name="test-read-ahead-error") as it:
            for page in it:
                got.append(page)
    assert raised.value is error and got == [1, 2]
    assert not _threads("test-read-ahead-error")


def test_a_caller_that_stops_early_closes_the_listing_in_its_thread_and_leaves_no_thread():
    source = PagedSource(pages=None)
    with read_ahead(source.iter_records(None, 5, Listing()), depth=1, name="test-read-ahead-break") as pages:
        for page in pages:
            break
    assert not _threads("test-read-ahead-break")
    assert source.closed and source.reader == "test-read-ahead-break"
    # one page taken, at most one queued and one being read when it stopped
    assert 1 <= source.requests_made <= 3


def test_fetch_modified_stages_every_page_read_ahead_and_counts_its_requests(db):
    source = PagedSource(pages=7, size=4)
    portal = Portal(name="p", url="https://p.org", politeness_delay=0)
    run_id = pipeline.begin(db, portal, full_sync=True)["run_id"]
    assert pipeline.fetch_modified(db, portal, run_id, source) == {"run_id": run_id, "fetched": 28, "failed": 0}
    assert _staged(db, run_id) == [f"p{n}-{i}" for n in range(1, 8) for i in range(4)]
    stats = db.execute("SELECT stats FROM sync_runs WHERE run_id = %s", (run_id,)).fetchone()[0]
    assert stats["portal_requests"] == 7 and stats["portal_bytes"] == 700
    assert source.reader == f"harvester-listing-{run_id}" and not _threads("harvester-listing-")


def test_an_error_of_the_source_on_page_3_reaches_the_caller_and_nothing_after_it_is_staged(db):
    error = RuntimeError("the portal broke on page 3")
    source = PagedSource(pages=10, size=5, fail_on=3, error=error)
    portal = Portal(name="p", url="https://p.org", politeness_delay=0)
    run_id = pipeline.begin(db, portal, full_sync=True)["run_id"]
    with pytest.raises(RuntimeError) as raised:
        pipeline.fetch_modified(db, portal, run_id, source)
    assert raised.value is error
    assert _staged(db, run_id) == [f"p{n}-{i}" for n in (1, 2) for i in range(5)]
    assert source.requests_made == 3 and source.closed
    stats = db.execute("SELECT stats FROM sync_runs WHERE run_id = %s", (run_id,)).fetchone()[0]
    assert stats["portal_requests"] == 3  # every request of the failed attempt counts
    assert not _threads("harvester-listing-")


def test_a_ckan_error_on_the_third_request_fails_the_step_after_two_pages(db, portal_server):
    portal_server.set_records([{"id": f"d{i:03d}", "name": f"d{i:03d}", "title": f"Dataset {i}",
                                "metadata_modified": f"2024-01-01T00:00:{i:02d}"} for i in range(50)])
    portal = Portal(name="p", url=portal_server.base_url, politeness_delay=0, page_size=10)
    run_id = pipeline.begin(db, portal, full_sync=True)["run_id"]
    seen = []

    def on_request(action, params):
        seen.append(action)
        if len(seen) == 3:
            portal_server.fail_next(1, status=404, body={"help": "", "success": False,
                                                         "error": {"__type": "Not Found Error", "message": "gone"}})

    portal_server.on_request = on_request
    source = pipeline.source_for(portal, max_retries=0)
    from harvester.sources.ckan import CkanError
    with pytest.raises(CkanError, match="HTTP 404 Not Found Error: gone"):
        pipeline.fetch_modified(db, portal, run_id, source)
    assert _staged(db, run_id) == [f"d{i:03d}" for i in range(20)]
    assert source.requests_made == 3
    stats = db.execute("SELECT stats FROM sync_runs WHERE run_id = %s", (run_id,)).fetchone()[0]
    assert stats["portal_requests"] == 3
    assert not _threads("harvester-listing-")


def test_staging_that_fails_stops_the_listing_and_leaves_no_thread(db, monkeypatch):
    source = PagedSource(pages=None, size=3)  # endless: only the stop ends it
    portal = Portal(name="p", url="https://p.org", politeness_delay=0)
    run_id = pipeline.begin(db, portal, full_sync=True)["run_id"]
    stage, calls = pipeline._stage, []

    def failing_stage(conn, run, seq, records, logged, attempt):
        calls.append(len(records))
        if len(calls) == 2:
            raise OSError("the database went away")
        return stage(conn, run, seq, records, logged, attempt)

    monkeypatch.setattr(pipeline, "_stage", failing_stage)
    with pytest.raises(OSError, match="the database went away"):
        pipeline.fetch_modified(db, portal, run_id, source)
    assert not _threads("harvester-listing-")
    assert source.closed
    # two pages taken, at most one queued and one being read when staging failed: bounded, and
    # the counters include every page the source read
    assert 2 <= source.requests_made <= 4
    stats = db.execute("SELECT stats FROM sync_runs WHERE run_id = %s", (run_id,)).fetchone()[0]
    assert stats["portal_requests"] == source.requests_made
    assert _staged(db, run_id) == [f"p1-{i}" for i in range(3)]
