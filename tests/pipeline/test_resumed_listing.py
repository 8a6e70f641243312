"""A retried fetch_modified resumes (issue 39): a source that declares it can
(``Capabilities.resumable``, a WAF fetched one file a request) keeps what the failed attempt
staged, skips those records, and staging goes on after them; the run ends exactly as an unbroken
one. Real PostgreSQL, the local WAF (testing/iso_waf_portal.py) over HTTP failing persistently
(HTTP 500) after its k-th file; its requests counted. A source that cannot resume starts over."""
from __future__ import annotations

import pytest

from harvester.config.portals import Portal
from harvester.http import RetriesExhausted
from harvester.pipeline import steps as pipeline
from harvester.store import runs
from harvester.testing.iso_waf_portal import WafServer, catalogue

FILES, FAIL_AFTER = 40, 23


@pytest.fixture
def provider(gemini):
    from harvester.embeddings import get_provider

    return get_provider()


def staged(conn, run_id: int) -> list[tuple[int, str, bool]]:
    return conn.execute("SELECT seq, source_id, error IS NULL FROM staging_records WHERE run_id = %s ORDER BY seq",
                        (run_id,)).fetchall()


def test_a_retried_fetch_of_a_waf_fetches_only_what_the_failed_attempt_did_not_stage(db, reader, provider):
    files = catalogue(FILES, per_folder=8)
    with WafServer(files, style="nginx") as waf:
        portal = Portal(name="waf", url=waf.url, type="iso-waf", politeness_delay=0, max_retries=1, page_size=10)
        run_id = pipeline.begin(db, portal, full_sync=True)["run_id"]
        waf.fail_files(after=FAIL_AFTER, times=2)  # file 24 answers 500 to both tries of the first attempt
        with pytest.raises(RetriesExhausted):
            pipeline.fetch_modified(db, portal, run_id, pipeline.source_for(portal))
        kept = staged(db, run_id)
        # the pages of 10 staged, and the page in hand when the fetch failed (3 more): all 23
        assert [seq for seq, _, _ in kept] == list(range(FAIL_AFTER))
        assert runs.get(db, run_id).stats["portal_requests"] == len(waf.requests)
        waf.requests.clear()
        out = pipeline.fetch_modified(db, portal, run_id, pipeline.source_for(portal))  # the task's retry
        fetched = [path for path, _, status in waf.file_requests() if status == 200]
        assert len(fetched) == FILES - FAIL_AFTER and len(waf.file_requests()) == FILES - FAIL_AFTER
        assert not {waf.base_url + p for p in fetched} & {sid for _, sid, _ in kept}
        assert (out["fetched"], out["failed"]) == (FILES, 0)
        after = staged(db, run_id)
        assert [seq for seq, _, _ in after] == list(range(FILES))  # staging went on after the kept records
        assert {sid for _, sid, _ in after} == {waf.url + p for p in files}
        assert runs.get(db, run_id).mode == "full"  # the walk was complete: removals apply
        pipeline.hash_compare(db, reader, portal, run_id, provider.model)
        pipeline.embed_changed(db, reader, portal, run_id, provider)
        stats = pipeline.upsert(db, portal, run_id, provider.model)
    assert (stats["created"], stats["failed"], stats["fetched"], stats["removed"]) == (FILES, 0, FILES, 0)
    live = {r[0] for r in db.execute("SELECT source_id FROM datasets WHERE removed_at IS NULL").fetchall()}
    assert live == {waf.url + p for p in files}


def test_a_source_that_cannot_resume_starts_its_listing_over(db, portal_server, samples):
    from harvester.testing.samples import distinct_records

    portal_server.set_records(distinct_records(samples, 30))
    portal = Portal(name="p", url=portal_server.base_url, politeness_delay=0, page_size=10, max_retries=0)
    run_id = pipeline.begin(db, portal, full_sync=True)["run_id"]
    source = pipeline.source_for(portal)
    assert not source.capabilities.resumable
    db.execute("INSERT INTO staging_records (run_id, seq, source_id) VALUES (%s, 0, 'left-by-a-failed-attempt')",
               (run_id,))
    pipeline.fetch_modified(db, portal, run_id, source)
    ids = [sid for _, sid, _ in staged(db, run_id)]
    assert len(ids) == 30 and "left-by-a-failed-attempt" not in ids
