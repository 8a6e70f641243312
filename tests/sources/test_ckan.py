"""The CKAN client against the demo portal over real HTTP: keyset listing, retries, errors."""
from __future__ import annotations

import base64
import email.utils
import logging
import os
import re
import socket
import time
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from harvester.sources.ckan import (CkanClient, CkanError, FilterRejected, PortalUnavailable, parse_ckan_timestamp, scrub_url, solr_date)
from harvester.testing.ckan_portal import DemoPortal, load_jsonl
from harvester.testing.samples import sample_path, samples_dir

REPO = Path(__file__).resolve().parents[2]
SAMPLES = samples_dir()
GC_1230 = sample_path("data-gc-ca-snapshot-2013-06-17T12-30.jsonl")


FQ_RE = re.compile(r"metadata_modified:\[\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z TO \*\]")


def make_client(base_url, **kw):
    kw = {"politeness_delay": 0, "backoff": 0.01, "max_backoff": 0.05, "max_retries": 3, "timeout": 10, **kw}
    return CkanClient(base_url, **kw)


def key(rec):
    dt = parse_ckan_timestamp(rec["metadata_modified"])
    return dt.replace(microsecond=dt.microsecond // 1000 * 1000), rec["id"]


def listing(client, since=None, page_size=1000):
    return [rec for page in client.iter_pages(since, page_size=page_size) for rec in page]


def copies(rec, n, metadata_modified, tag):
    """n real records with new ids (deterministic) and one shared metadata_modified."""
    return [dict(rec, id=str(uuid.uuid5(uuid.NAMESPACE_URL, f"{tag}-{i}")), name=f"{rec['name']}-{tag}-{i}",
                 metadata_modified=metadata_modified) for i in range(n)]


# -- keyset listing ------------------------------------------------------------------------------
@pytest.mark.parametrize("page_size", [1, 7, 50, 1000])
def test_full_listing_yields_every_id_once(gc_portal, gc_records, page_size):
    client = make_client(gc_portal.base_url)
    got = listing(client, page_size=page_size)
    ids = [r["id"] for r in got]
    assert len(ids) == len(set(ids)) == 489
    assert set(ids) == {r["id"] for r in gc_records}
    assert [key(r) for r in got] == sorted(key(r) for r in got)  # oldest first, id order within a millisecond
    assert client.requests_made == len(gc_portal.requests)
    assert client.total == 489
    first, *rest = [params for _, params in gc_portal.requests]
    assert first == {"q": "*:*", "sort": "metadata_modified asc, id asc", "rows": str(page_size), "start": "0"}
    # keyset, not offsets: later requests filter on the last timestamp and start at 0 (no ties here)
    assert all(FQ_RE.fullmatch(p["fq"]) and p["start"] == "0" and p["sort"] == first["sort"] for p in rest)
    assert len(rest) == -(-489 // page_size) - 1


def test_a_portal_without_count_capping_its_rows_is_listed_to_the_empty_page(gc_portal, gc_records):
    # issue 36: no "count" in the answers, and ckan.search.rows_max (7) below the rows asked (10):
    # a short page is no proof of the end; the empty page after the last is
    gc_portal.omit_count, gc_portal.rows_max = True, 7
    client = make_client(gc_portal.base_url)
    ids = [r["id"] for r in listing(client, page_size=10)]
    assert len(ids) == len(set(ids)) == 489 and set(ids) == {r["id"] for r in gc_records}
    assert client.cut is None and client.total is None
    # the last answer holds only the record the listing stood on: nothing after it
    assert [p for _, p in gc_portal.requests][-1]["rows"] == "11"


def test_since_filter_gives_only_newer_records(gc_portal, gc_records):
    since = datetime(2013, 6, 14, 12, 0)  # naive: UTC
    client = make_client(gc_portal.base_url)
    got = listing(client, since=since, page_size=10)
    utc_since = since.replace(tzinfo=timezone.utc)
    expected = {r["id"] for r in gc_records if parse_ckan_timestamp(r["metadata_modified"]) >= utc_since}
    assert 10 < len(expected) < 489
    assert [r["id"] for r in got] == [r["id"] for r in sorted(gc_records, key=key) if r["id"] in expected]
    assert gc_portal.requests[0][1]["fq"] == "metadata_modified:[2013-06-14T12:00:00.000Z TO *]"
    # the same instant in another zone asks the same question
    gc_portal.requests.clear()
    edt = datetime(2013, 6, 14, 8, 0, tzinfo=timezone(timedelta(hours=-4)))
    assert {r["id"] for r in listing(make_client(gc_portal.base_url), since=edt)} == expected
    assert gc_portal.requests[0][1]["fq"] == "metadata_modified:[2013-06-14T12:00:00.000Z TO *]"


def test_since_is_millisecond_precision_rounded_down(gc_portal):
    # the newest record is 2013-06-17T15:32:05.305546: Solr knows it as .305
    client = make_client(gc_portal.base_url)
    got = listing(client, since=datetime(2013, 6, 17, 15, 32, 5, 305999, tzinfo=timezone.utc))
    assert [r["metadata_modified"] for r in got] == ["2013-06-17T15:32:05.305546"]
    assert gc_portal.requests[-1][1]["fq"] == "metadata_modified:[2013-06-17T15:32:05.305Z TO *]"
    assert listing(client, since=datetime(2013, 6, 17, 15, 32, 5, 306000)) == []
    assert solr_date(datetime(2013, 6, 17, 11, 50, 0, 999)) == "2013-06-17T11:50:00.000Z"


def test_ties_larger_than_a_page(gc_records):
    ordered = sorted(gc_records, key=key)
    first_ts = ordered[0]["metadata_modified"]
    mid_ts = ordered[200]["metadata_modified"]
    extra = copies(ordered[0], 12, first_ts, "first") + copies(ordered[200], 23, mid_ts, "mid") \
        + copies(ordered[-1], 11, "2013-06-18T00:00:00", "last")
    with DemoPortal(records=gc_records + extra) as p:
        client = make_client(p.base_url)
        ids = [r["id"] for r in listing(client, page_size=5)]
        assert len(ids) == len(set(ids)) == 489 + 46
        assert set(ids) == {r["id"] for r in gc_records + extra}
        starts = [int(params["start"]) for _, params in p.requests]
        assert max(starts) > 5  # moved through a tie group with start
        # and a since-listing that begins inside a tie group
        since = parse_ckan_timestamp(mid_ts)
        later = [r["id"] for r in listing(client, since=since, page_size=4)]
        expected = {r["id"] for r in gc_records + extra if parse_ckan_timestamp(r["metadata_modified"]) >= since}
        assert len(later) == len(set(later)) == len(expected) > 23
        assert set(later) == expected


def test_tie_group_shrinking_mid_listing_skips_nothing(gc_records):
    ties = copies(gc_records[0], 20, "2013-06-01T00:00:00.000001", "tie")
    later = sorted(gc_records, key=key)[-5:]
    with DemoPortal(records=ties + later) as p:
        client = make_client(p.base_url)
        pages = client.iter_pages(None, page_size=5)
        got = list(next(pages))
        first_five = sorted(t["id"] for t in ties)[:5]
        assert [r["id"] for r in got] == first_five
        # three records we already have are modified: they leave the tie group (jump to the end)
        # and the rest of the group shifts left under our `start`
        for tid in first_five[:3]:
            p.upsert_record(dict(next(t for t in ties if t["id"] == tid), metadata_modified="2014-01-01T00:00:00"))
        for page in pages:
            got.extend(page)
        ids = [r["id"] for r in got]
        assert set(ids) == {r["id"] for r in ties + later}
        assert sorted(i for i in set(ids) if ids.count(i) > 1) == sorted(first_five[:3])  # old and new versions
        assert all(ids.count(t["id"]) == 1 for t in ties if t["id"] not in first_five[:3])
        starts = [int(params["start"]) for _, params in p.requests]
        assert starts[:3] == [0, 4, 0]  # found the shift at start=4 and stepped back


def test_record_modified_mid_listing_is_still_fetched(gc_portal, gc_records):
    ordered = sorted(gc_records, key=key)
    client = make_client(gc_portal.base_url)
    pages = client.iter_pages(None, page_size=50)
    got = list(next(pages))
    assert len(got) == 50
    ahead, behind, gone = ordered[300], ordered[10], ordered[20]
    gc_portal.upsert_record(dict(ahead, metadata_modified="2013-06-18T09:00:00.123456", title="edited"))
    gc_portal.upsert_record(dict(behind, metadata_modified="2013-06-18T09:00:01"))
    gc_portal.remove_record(gone["id"])
    for page in pages:
        got.extend(page)
    ids = [r["id"] for r in got]
    assert set(ids) == {r["id"] for r in gc_records}
    assert ids.count(ahead["id"]) == 1  # not seen at its old place, fetched at its new one
    assert next(r for r in got if r["id"] == ahead["id"])["title"] == "edited"
    assert ids.count(behind["id"]) == 2  # the old version, then the new one at the end
    assert ids[-2:] == [ahead["id"], behind["id"]]
    assert len(ids) == 490


def test_records_without_id_or_timestamp_are_yielded(gc_records):
    no_id = {k: v for k, v in gc_records[0].items() if k != "id"}
    no_ts = {k: v for k, v in gc_records[1].items() if k != "metadata_modified"}
    with DemoPortal(records=gc_records[2:] + [no_id, no_ts]) as p:
        got = listing(make_client(p.base_url), page_size=1000)  # one page: Solr lists undated ones last
        assert len(got) == 489 and got[-1] == no_ts and no_id in got
        got = listing(make_client(p.base_url), page_size=50)  # keyset: a range fq never matches undated ones
        assert len(got) == 488 and no_id in got


@pytest.mark.parametrize("page_size", [7, 50])
def test_pages_of_records_without_id_are_all_listed_not_taken_for_a_repeated_page(gc_records, page_size):
    # A broken portal whose records lack ids, some sharing a timestamp across a page boundary: each
    # is listed once (to fail, and be reported), and two such pages are not "the same page again".
    no_ids = [{**{k: v for k, v in rec.items() if k != "id"}, "name": f"no-id-{i}",
               "metadata_modified": f"2020-01-01T00:00:{i // 3:02d}.000000"} for i, rec in enumerate(gc_records[:120])]
    with DemoPortal(records=no_ids + gc_records[120:140]) as p:
        client = make_client(p.base_url)
        got = listing(client, page_size=page_size)
        assert client.cut is None
        assert sorted(r["name"] for r in got if "id" not in r) == sorted(r["name"] for r in no_ids)
        assert len(got) == 140


def test_incremental_between_two_real_snapshots(gc_records):
    """data.gc.ca 40 minutes apart: 6 datasets changed, 12 added, and most of them carry a
    metadata_modified OLDER than the newest record of the first snapshot. A since = newest-seen
    watermark misses them; a lookback window catches them."""
    second = load_jsonl(GC_1230)
    before = {r["id"]: r for r in gc_records}
    changed = {r["id"] for r in second if r["id"] not in before or before[r["id"]] != r}
    assert len(changed) == 18
    with DemoPortal(records=gc_records) as p:
        client = make_client(p.base_url)
        watermark = max(parse_ckan_timestamp(r["metadata_modified"]) for r in listing(client))
        p.set_records(second)
        naive = {r["id"] for r in listing(client, since=watermark)}
        assert naive < changed and len(naive) == 3  # 15 of 18 changes missed
        with_lookback = {r["id"] for r in listing(client, since=watermark - timedelta(hours=2))}
        assert changed <= with_lookback


def test_full_listing_without_fq_when_the_portal_rejects_it(gc_portal, gc_records):
    gc_portal.reject_fq = True
    # a fresh client finds out on its second page, and lists on with plain offsets
    client = make_client(gc_portal.base_url)
    ids = [r["id"] for r in listing(client, page_size=50)]
    assert len(ids) == len(set(ids)) == 489
    assert [("fq" in params, params["start"]) for _, params in gc_portal.requests[:4]] == [
        (False, "0"), (True, "0"), (False, "0"), (False, "49")]
    # an incremental listing is refused (the caller falls back to a full one) ...
    client = make_client(gc_portal.base_url)
    with pytest.raises(FilterRejected):
        listing(client, since=datetime(2013, 6, 1), page_size=50)
    # ... which then does not try fq again
    gc_portal.requests.clear()
    ids = [r["id"] for r in listing(client, page_size=50)]
    assert len(ids) == len(set(ids)) == 489
    assert not any("fq" in params for _, params in gc_portal.requests)
    assert [int(params["start"]) for _, params in gc_portal.requests] == [0] + [50 * i - 1 for i in range(1, 10)]


def first_page_always(portal):
    """The portal answers every listing request (not a count) with its answer to the first one, as a
    cache that ignores the query string would: the pages come round again."""
    first = {}

    def same_page(action, params):
        if action != "package_search" or params.get("rows") == "0":
            return
        if not first:
            first.update(params)
        else:
            params.clear()
            params.update(first)

    portal.on_request = same_page


def test_a_repeated_page_cuts_a_full_listing_incomplete(gc_portal, caplog):
    from harvester.sources.base import Listing
    from harvester.sources.ckan import CkanSource

    first_page_always(gc_portal)
    source = CkanSource(make_client(gc_portal.base_url), gc_portal.base_url)
    listing_ = Listing()
    with caplog.at_level(logging.WARNING, logger="harvester"):
        records = [r for page in source.iter_records(None, 50, listing_) for r in page]
    # 50 records; the keyset request answered with them is taken for an ignored fq, the offset
    # listing then gets them twice more: the second time, the same page as before, it stops
    assert len(records) == 50 and not listing_.complete
    assert "repeats the page before it" in source.client.cut and gc_portal.base_url in source.client.cut
    assert source.client.cut in caplog.text
    assert [("fq" in params, params["start"]) for _, params in gc_portal.requests] == [
        (False, "0"), (True, "0"), (False, "0"), (False, "49")]
    with pytest.raises(CkanError, match="incomplete identifier listing"):   # never taken for the portal's ids
        list(source.list_ids(50))
    gc_portal.on_request = None
    listing_ = Listing()
    assert len([r for page in source.iter_records(None, 50, listing_) for r in page]) == 489 and listing_.complete


# -- errors --------------------------------------------------------------------------------------
def test_reject_fq_raises_filter_rejected(gc_portal):
    gc_portal.reject_fq = True
    client = make_client(gc_portal.base_url)
    with pytest.raises(FilterRejected) as info:
        listing(client, since=datetime(2013, 6, 14))
    exc = info.value
    assert isinstance(exc, CkanError) and not exc.transient
    assert (exc.status, exc.error_type, exc.action) == (409, "Search Error", "package_search")
    text = str(exc)
    assert text.startswith(f"{gc_portal.base_url} package_search: HTTP 409 Search Error: Search error: "
                           "'SOLR returned an error running query: {")
    assert "[Reason: undefined field metadata_modified]" in text
    assert text.endswith("(fq 'metadata_modified:[2013-06-14T00:00:00.000Z TO *]')")
    assert client.requests_made == 1  # terminal: not retried


def test_400_search_query_error_with_and_without_fq(gc_portal):
    client = make_client(gc_portal.base_url)
    with pytest.raises(FilterRejected) as info:
        client.package_search(fq="type:dataset", sort="metadata_modified sideways")
    assert str(info.value) == (f"{gc_portal.base_url} package_search: HTTP 400 Search Query Error: Search Query is "
                               "invalid: 'Invalid \"sort\" parameter' (fq 'type:dataset')")
    with pytest.raises(CkanError) as info:
        client.package_search(sort="metadata_modified sideways")
    assert type(info.value) is CkanError
    assert str(info.value) == (f"{gc_portal.base_url} package_search: HTTP 400 Search Query Error: Search Query is "
                               "invalid: 'Invalid \"sort\" parameter'")


def test_package_show(gc_portal, gc_records):
    client = make_client(gc_portal.base_url)
    rec = gc_records[5]
    assert client.package_show(rec["id"]) == rec
    assert client.package_show(rec["name"]) == rec
    with pytest.raises(CkanError) as info:
        client.package_show("no-such-dataset")
    exc = info.value
    assert type(exc) is CkanError and not exc.transient
    assert str(exc) == f"{gc_portal.base_url} package_show: HTTP 404 Not Found Error: Not found"
    assert (exc.status, exc.error_type) == (404, "Not Found Error")
    assert client.requests_made == 3


def test_status(gc_portal):
    assert make_client(gc_portal.base_url + "/api/3/").status()["ckan_version"] == "2.10.4"


def test_non_json_answer_names_the_action(gc_portal):
    client = make_client(gc_portal.base_url + "/not-ckan")
    with pytest.raises(CkanError) as info:
        client.status()
    assert str(info.value) == (f"{gc_portal.base_url}/not-ckan status_show: HTTP 404, not a JSON answer "
                               "(text/html;charset=utf-8): <html><body><h1>404 Not Found</h1></body></html>")


# -- retries -------------------------------------------------------------------------------------
@pytest.mark.parametrize("status", [500, 503])
def test_retry_on_5xx_then_success(gc_portal, status):
    gc_portal.fail_next(2, status)
    client = make_client(gc_portal.base_url)
    assert client.status()["ckan_version"] == "2.10.4"
    assert client.requests_made == 3 == len(gc_portal.requests)


def test_retry_mid_listing(gc_portal):
    client = make_client(gc_portal.base_url)
    pages = client.iter_pages(None, page_size=100)
    got = list(next(pages))
    gc_portal.fail_next(2, 503, action="package_search")
    for page in pages:
        got.extend(page)
    assert len({r["id"] for r in got}) == len(got) == 489
    assert client.requests_made == 5 + 2 == len(gc_portal.requests)


def test_429_retry_after_is_honoured(gc_portal):
    gc_portal.fail_next(1, 429, retry_after=1)
    client = make_client(gc_portal.base_url, max_backoff=5)
    started = time.monotonic()
    client.status()
    assert 0.95 <= time.monotonic() - started < 3
    assert client.requests_made == 2
    # an HTTP-date works too (whole seconds: this one is 1 to 2 s ahead)
    gc_portal.fail_next(1, 429, retry_after=email.utils.formatdate(time.time() + 2, usegmt=True))
    client = make_client(gc_portal.base_url, max_backoff=5)
    started = time.monotonic()
    client.status()
    assert 0.9 <= time.monotonic() - started < 3
    # max_backoff caps what the portal asks for
    gc_portal.fail_next(1, 429, retry_after=3600)
    client = make_client(gc_portal.base_url, max_backoff=0.2)
    started = time.monotonic()
    client.status()
    assert 0.2 <= time.monotonic() - started < 1.5
    assert client.requests_made == 2


def test_retries_exhausted(gc_portal):
    gc_portal.fail_next(3, 503)
    client = make_client(gc_portal.base_url, max_retries=2)
    with pytest.raises(PortalUnavailable) as info:
        client.status()
    exc = info.value
    assert exc.transient and isinstance(exc, CkanError)
    assert str(exc) == f"{gc_portal.base_url} status_show: portal unavailable after 3 attempts (last: HTTP 503)"
    assert (exc.status, exc.action) == (503, "status_show")
    assert client.requests_made == 3 == len(gc_portal.requests)
    gc_portal.fail_next(3, 429, retry_after=0)
    with pytest.raises(PortalUnavailable, match=r"after 3 attempts \(last: HTTP 429\)"):
        client.status()
    assert client.status()["ckan_version"]  # the queue of failures is used up


def test_total_outage_during_listing(gc_portal):
    client = make_client(gc_portal.base_url, max_retries=1)
    gc_portal.fail_actions = {"package_search"}
    with pytest.raises(PortalUnavailable) as info:
        listing(client, since=datetime(2013, 6, 1))
    assert str(info.value) == (f"{gc_portal.base_url} package_search: portal unavailable after 2 attempts"
                               " (last: HTTP 500)")


def test_connection_refused():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = make_client(f"http://127.0.0.1:{port}", max_retries=1)
    with pytest.raises(PortalUnavailable) as info:
        client.status()
    assert str(info.value) == (f"http://127.0.0.1:{port} status_show: portal unavailable after 2 attempts "
                               "(last: connection refused)")
    assert client.requests_made == 2


def test_timeout(gc_portal):
    gc_portal.response_delay = 0.5
    client = make_client(gc_portal.base_url, timeout=0.1, max_retries=1)
    with pytest.raises(PortalUnavailable) as info:
        client.status()
    assert str(info.value) == (f"{gc_portal.base_url} status_show: portal unavailable after 2 attempts "
                               "(last: timed out: nothing received for 0.1 s)")


# Answers with status 200 that CKAN did not write: a proxy's or a captive portal's page, a truncated
# body, an envelope without success. (body for fail_next, what the error says of the last attempt)
NOT_CKAN = {
    "html page": (None, "HTTP 200, not a JSON answer (text/html;charset=utf-8): "
                        "<html><body><h1>HTTP 200</h1></body></html>"),
    "broken json": ('{"help": "x", "success": tr', "HTTP 200, not a JSON answer (application/json;charset=utf-8): "
                                                   '{"help": "x", "success": tr'),
    "success false": ({"help": "x", "success": False, "error": {"__type": "Internal Server Error",
                                                                "message": "Internal Server Error"}},
                      "HTTP 200 with success: false, Internal Server Error: Internal Server Error"),
    "no envelope": ({"count": 3}, 'HTTP 200, not a CKAN action answer: {"count": 3}'),
}


@pytest.mark.parametrize("body, last", NOT_CKAN.values(), ids=list(NOT_CKAN))
def test_answers_not_from_ckan_are_retried_like_5xx(gc_portal, body, last):
    gc_portal.fail_next(2, 200, body=body)
    client = make_client(gc_portal.base_url)
    assert client.status()["ckan_version"] == "2.10.4"
    assert client.requests_made == 3 == len(gc_portal.requests)
    # when the retries are spent: PortalUnavailable (transient), never a FilterRejected
    gc_portal.fail_next(3, 200, body=body, action="package_search")
    client = make_client(gc_portal.base_url, max_retries=2)
    with pytest.raises(PortalUnavailable) as info:
        listing(client, since=datetime(2013, 6, 1))
    assert str(info.value) == f"{gc_portal.base_url} package_search: portal unavailable after 3 attempts (last: {last})"
    assert client.requests_made == 3


def test_ckan_errors_other_than_a_refused_filter_are_not_filter_rejected(gc_portal):
    gc_portal.fail_next(1, 403, action="package_search", body={
        "help": "x", "success": False, "error": {"__type": "Authorization Error", "message": "Access denied"}})
    client = make_client(gc_portal.base_url)
    with pytest.raises(CkanError) as info:
        listing(client, since=datetime(2013, 6, 1))
    assert type(info.value) is CkanError and not info.value.transient
    assert str(info.value) == f"{gc_portal.base_url} package_search: HTTP 403 Authorization Error: Access denied"
    assert client.requests_made == 1


# -- politeness and secrets ----------------------------------------------------------------------
def test_politeness_delay(gc_portal):
    client = make_client(gc_portal.base_url, politeness_delay=0.2)
    started = time.monotonic()
    for _ in range(3):
        client.status()
    assert time.monotonic() - started >= 0.4


def test_credentials_are_sent_but_never_logged(gc_portal, caplog):
    caplog.set_level(logging.DEBUG, logger="harvester")
    host = gc_portal.base_url.removeprefix("http://")
    client = make_client(f"http://harvest:s3cret@{host}", api_key="KEY-0123456789")
    assert client.portal == f"http://***@{host}" == scrub_url(f"http://harvest:s3cret@{host}")
    gc_portal.fail_next(1, 500)
    client.status()
    listing(client, since=datetime(2013, 6, 17), page_size=5)
    with pytest.raises(CkanError) as info:
        client.package_show("missing")
    headers = gc_portal.request_headers[-1]
    assert headers["Authorization"] == "KEY-0123456789"
    assert headers["User-Agent"] == "harvester/0.1"
    assert "retry 1 of 3" in caplog.text  # something was logged
    for secret in ("s3cret", "KEY-0123456789"):
        assert secret not in caplog.text
        assert secret not in str(info.value)
    assert str(info.value) == f"http://***@{host} package_show: HTTP 404 Not Found Error: Not found"


def test_basic_auth_from_the_url_or_given(gc_portal):
    host = gc_portal.base_url.removeprefix("http://")
    client = make_client(f"http://harvest:p%40ss%2Fw@{host}/api/3")
    assert client.base_url == gc_portal.base_url and client.portal == f"http://***@{host}"
    client.status()
    assert gc_portal.request_headers[-1]["Authorization"] == "Basic " + base64.b64encode(b"harvest:p@ss/w").decode()
    client = make_client(gc_portal.base_url, basic_auth=("robot", "Pw-9f8e7d"))
    client.status()
    assert gc_portal.request_headers[-1]["Authorization"] == "Basic " + base64.b64encode(b"robot:Pw-9f8e7d").decode()
    assert client.portal == gc_portal.base_url and "Pw-9f8e7d" not in repr(client) + repr(vars(client))
    assert "include_private" not in gc_portal.requests[-1][1]
    # an API token is what CKAN reads: it wins over basic auth
    client = make_client(gc_portal.base_url, basic_auth=("robot", "Pw-9f8e7d"), api_key="KEY-55aa")
    client.status()
    assert gc_portal.request_headers[-1]["Authorization"] == "KEY-55aa"


def test_api_key_lists_private_datasets(gc_records):
    private = [dict(r, private=True) for r in gc_records[:7]]
    public = gc_records[7:]
    with DemoPortal(records=private + public) as portal:
        portal.api_tokens = {"TOKEN-of-an-editor"}
        for anonymous in (make_client(portal.base_url), make_client(portal.base_url, api_key="TOKEN-wrong")):
            assert {r["id"] for r in listing(anonymous)} == {r["id"] for r in public}
            assert anonymous.count() == len(public)
            with pytest.raises(CkanError) as info:
                anonymous.package_show(private[0]["id"])
            assert info.value.status == 403
        client = make_client(portal.base_url, api_key="TOKEN-of-an-editor")
        portal.requests.clear()
        assert {r["id"] for r in listing(client, page_size=100)} == {r["id"] for r in private + public}
        assert {r["id"] for r in listing(client, since=datetime(2000, 1, 1))} == {r["id"] for r in private + public}
        assert client.count() == len(private) + len(public)
        assert all(params.get("include_private") == "true" for action, params in portal.requests)
        assert portal.request_headers[-1]["Authorization"] == "TOKEN-of-an-editor"
        ids = [r["id"] for r in private]
        assert sorted(r["id"] for page in client.fetch_by_ids(ids) for r in page) == sorted(ids)
        assert client.package_show(ids[0])["private"] is True


# -- reconciliation's calls ------------------------------------------------------------------------
def test_count_is_one_request_of_no_rows(gc_portal, gc_records):
    client = make_client(gc_portal.base_url)
    assert client.count() == len(gc_records)
    (action, params), = gc_portal.requests
    assert action == "package_search" and params["rows"] == "0" and "fq" not in params
    assert client.requests_made == 1 and client.bytes_received > 0


def test_identifier_listing_keyset_pages_with_ties_and_few_bytes(gc_records):
    ordered = sorted(gc_records, key=key)
    extra = copies(ordered[100], 17, ordered[100]["metadata_modified"], "tie")
    with DemoPortal(records=gc_records + extra) as p:
        full = make_client(p.base_url)
        whole = listing(full, page_size=7)
        slim = make_client(p.base_url)
        ids = [r for page in slim.iter_pages(None, page_size=7, fields=("id", "metadata_modified")) for r in page]
        assert [r["id"] for r in ids] == [r["id"] for r in whole]          # same order, nothing skipped
        assert all(set(r) == {"id", "metadata_modified"} for r in ids)
        assert ids[0]["metadata_modified"].endswith("Z")                     # Solr's date format
        assert {parse_ckan_timestamp(r["metadata_modified"]) for r in ids} == \
            {parse_ckan_timestamp(r["metadata_modified"]).replace(microsecond=parse_ckan_timestamp(
                r["metadata_modified"]).microsecond // 1000 * 1000) for r in whole}
        assert all(params.get("fl") == "id,metadata_modified" for _, params in p.requests[-slim.requests_made:])
        assert slim.bytes_received * 20 < full.bytes_received, (slim.bytes_received, full.bytes_received)
    with pytest.raises(ValueError, match="must include 'id' and 'metadata_modified'"):
        next(make_client("http://127.0.0.1:9").iter_pages(None, fields=("id",)))


def test_fetch_by_ids_in_batches(gc_portal, gc_records):
    client = make_client(gc_portal.base_url)
    wanted = [r["id"] for r in gc_records[:25]] + ["no-such-dataset"]
    pages = list(client.fetch_by_ids(wanted, per_request=10))
    got = [r["id"] for page in pages for r in page]
    assert sorted(got) == sorted(wanted[:25]) and [len(p) for p in pages] == [10, 10, 5]
    fqs = [params["fq"] for _, params in gc_portal.requests]
    assert len(fqs) == 3 and all(fq.startswith('id:("') for fq in fqs)
    assert [gc_records[0] == r for page in pages for r in page if r["id"] == gc_records[0]["id"]] == [True]


@pytest.mark.parametrize("fault", ["reject_fq", "ignore_fq"])
def test_fetch_by_ids_falls_back_to_package_show(gc_portal, gc_records, fault, caplog):
    setattr(gc_portal, fault, True)
    client = make_client(gc_portal.base_url)
    wanted = [r["id"] for r in gc_records[100:104]] + ["no-such-dataset"]   # not the catalogue's first
    with caplog.at_level(logging.WARNING, logger="harvester.ckan"):
        got = [r["id"] for page in client.fetch_by_ids(wanted, per_request=3) for r in page]
    assert got == wanted[:4]
    actions = [action for action, _ in gc_portal.requests]
    assert actions == ["package_search"] + ["package_show"] * 5   # asked once, then one by one
    assert len([r for r in caplog.records if "package_show, one request each" in r.getMessage()]) == 1


def test_ids_with_quotes_are_escaped(gc_records):
    odd = dict(gc_records[0], id='odd "quoted" \\ id', name="odd-id")
    with DemoPortal(records=[odd] + gc_records[1:3]) as p:
        got = [r["id"] for page in make_client(p.base_url).fetch_by_ids([odd["id"], gc_records[1]["id"]]) for r in page]
        assert sorted(got) == sorted([odd["id"], gc_records[1]["id"]])
