"""The Socrata Discovery API source (harvester.sources.socrata) on real recorded answers
(tests/data/socrata/, see its README): the mapping of every real result, paging newest first
against a local Discovery API on 127.0.0.1 (a full listing by ``scroll_id``, past the API's
10,000-result offset window; an incremental one newest first), the stop at ``since``, loop and
window guards, an ignored ordering, transient and terminal errors."""
from __future__ import annotations

import copy
import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from harvester.domain.dataset import parse_timestamp
from harvester.http import HttpFetcher
from harvester.sources.base import FilterRejected, Listing, SourceError, SourceUnavailable
from harvester.sources.socrata import SocrataSource, catalogue_of, normalize, to_package
from harvester.testing.socrata_portal import SocrataServer

DATA = Path(__file__).resolve().parents[1] / "data" / "socrata"
FILES = ["chicago_transportation.json", "chicago_cta.json", "chicago_ids.json"]
DOMAIN = "data.cityofchicago.org"


def real_results() -> list[dict]:
    """The distinct results of the recorded answers, in file order."""
    out: dict[str, dict] = {}
    for name in FILES:
        for result in json.loads((DATA / name).read_text())["results"]:
            out.setdefault(result["resource"]["id"], result)
    return list(out.values())


def synthetic(n: int, start: datetime = datetime(2020, 1, 1, tzinfo=timezone.utc)) -> list[dict]:
    """n results derived from the real ones: new ids, names and update times (one minute apart)."""
    base = real_results()
    out = []
    for i in range(n):
        result = copy.deepcopy(base[i % len(base)])
        ident = f"s{i:03d}-{i:04d}"
        result["resource"].update(id=ident, name=f"{result['resource']['name']} #{i}",
                                  updatedAt=start.replace(minute=i % 60, hour=(i // 60) % 24).strftime(
                                      "%Y-%m-%dT%H:%M:%S.000Z"))
        result["permalink"] = f"https://{DOMAIN}/d/{ident}"
        out.append(result)
    return out


def small(n: int, start: datetime = datetime(2020, 1, 1, tzinfo=timezone.utc)) -> list[dict]:
    """n small results (id, name, type, update time, domain): enough for listings of thousands."""
    return [{"resource": {"id": f"n{i:04d}-{i:05d}", "name": f"Dataset {i}", "type": "dataset",
                          "updatedAt": (start + timedelta(seconds=i)).strftime("%Y-%m-%dT%H:%M:%S.000Z")},
             "metadata": {"domain": DOMAIN}, "permalink": f"https://{DOMAIN}/d/n{i:04d}-{i:05d}"} for i in range(n)]


@pytest.fixture
def server():
    with SocrataServer(real_results()) as srv:
        yield srv


def source(srv, **fetcher) -> SocrataSource:
    settings = {"max_retries": 3, "backoff": 0, "sleep": lambda s: None, **fetcher}
    return SocrataSource(srv.base_url, fetcher=HttpFetcher(srv.base_url, **settings), portal="chicago")


def listed(src, since=None, page_size=1000) -> tuple[list, Listing]:
    listing = Listing()
    records = [r for page in src.iter_records(since, page_size, listing) for r in page]
    return records, listing


# -- mapping ---------------------------------------------------------------------------------------
def test_every_real_result_maps_to_a_record():
    results = real_results()
    assert len(results) == 21
    for result in results:
        rec = normalize(result, f"https://{DOMAIN}/api/catalog/v1")
        res = result["resource"]
        assert rec.ok, rec.error
        assert rec.source_id == res["id"] and rec.name == res["id"]
        assert rec.title == res["name"].strip()
        assert rec.url == result["permalink"]
        assert rec.organization == res["attribution"]
        assert rec.metadata_modified == parse_timestamp(res["updatedAt"])
        assert set(rec.tags) == set(result["classification"]["domain_tags"]) | set(result["classification"]["tags"])
        urls = [r["url"] for r in rec.raw["resources"]]
        assert urls == [f"https://{DOMAIN}/resource/{res['id']}.json",
                        f"https://{DOMAIN}/api/views/{res['id']}/rows.csv?accessType=DOWNLOAD"]
        assert rec.raw["license_id"] == result["metadata"].get("license")


def test_the_cta_ridership_dataset_in_detail():
    result = next(r for r in real_results() if r["resource"]["id"] == "6iiy-9s97")
    pkg = to_package(result)
    assert pkg["title"] == "CTA - Ridership - Daily Boarding Totals"
    assert pkg["organization"] == {"title": "Chicago Transit Authority", "name": "chicago-transit-authority"}
    assert [t["name"] for t in pkg["tags"]] == ["cta", "public transit", "ridership"]
    assert [g["name"] for g in pkg["groups"]] == ["Transportation"]
    assert pkg["license_id"] == "See Terms of Use"
    assert pkg["metadata_created"] == "2011-08-12T15:40:31.000Z"
    extras = {e["key"]: e["value"] for e in pkg["extras"]}
    assert extras["domain_metadata.Metadata_Data-Owner"] == "Chicago Transit Authority "
    assert extras["link"] == f"https://{DOMAIN}/Transportation/CTA-Ridership-Daily-Boarding-Totals/6iiy-9s97"
    assert json.loads(extras["owner"])["display_name"] == "CTA"
    assert extras["resource.attribution_link"] == "http://www.transitchicago.com"
    # what changes without the dataset changing is not in the extras (the metadata hash)
    assert not any(k.startswith(("resource.page_views", "resource.download_count", "resource.data_updated_at"))
                   for k in extras)


def test_views_and_downloads_do_not_change_the_metadata_hash_but_an_edit_does():
    result = real_results()[0]
    before = normalize(result, "u")
    busier = copy.deepcopy(result)
    busier["resource"]["page_views"]["page_views_total"] += 100
    busier["resource"]["download_count"] += 5
    busier["resource"]["data_updated_at"] = "2026-01-01T00:00:00.000Z"
    assert normalize(busier, "u").metadata_hash == before.metadata_hash
    edited = copy.deepcopy(result)
    edited["classification"]["domain_metadata"].append({"key": "Metadata_Frequency", "value": "Weekly"})
    assert normalize(edited, "u").metadata_hash != before.metadata_hash


def test_results_without_id_or_name_fail_naming_the_dataset():
    result = copy.deepcopy(real_results()[0])
    del result["resource"]["name"]
    rec = normalize(result, "https://x/api/catalog/v1")
    assert not rec.ok and rec.source_id == result["resource"]["id"] and "no name" in rec.error
    result = copy.deepcopy(real_results()[1])
    result["resource"]["id"] = ""
    rec = normalize(result, "https://x/api/catalog/v1")
    assert not rec.ok and rec.source_id is None and result["resource"]["name"] in rec.error


def test_portal_urls():
    assert catalogue_of("https://data.cityofchicago.org") == ("https://data.cityofchicago.org/api/catalog/v1", DOMAIN)
    assert catalogue_of("https://api.us.socrata.com/api/catalog/v1?domains=data.cityofchicago.org") == (
        "https://api.us.socrata.com/api/catalog/v1", DOMAIN)


# -- listing ---------------------------------------------------------------------------------------
def test_a_full_listing_scrolls_by_id_and_is_complete(server):
    src = source(server)
    records, listing = listed(src, page_size=4)
    want = sorted(r["resource"]["id"] for r in real_results())
    assert [r.source_id for r in records] == want
    assert listing.complete and src.total == 21
    queries = server.catalog_requests()
    assert len(queries) == 6 == src.requests_made  # 21 in pages of 4
    # each page after the last id of the one before, the first from the start; no offset, no order
    assert [q["scroll_id"] for q in queries] == [[""]] + [[want[i]] for i in range(3, 21, 4)]
    assert all("offset" not in q and "order" not in q and q["limit"] == ["4"] and q["domains"] == ["127.0.0.1"]
               and q["only"] == ["dataset"] for q in queries)


def test_an_incremental_listing_pages_newest_first_by_offset(server):
    src = source(server)
    records, listing = listed(src, since=datetime(2000, 1, 1, tzinfo=timezone.utc), page_size=4)
    want = sorted(real_results(), key=lambda r: r["resource"]["updatedAt"], reverse=True)
    assert [r.source_id for r in records] == [r["resource"]["id"] for r in want]
    queries = server.catalog_requests()
    assert [q["offset"] for q in queries] == [[str(o)] for o in range(0, 24, 4)]
    assert all(q["order"] == ["updatedAt DESC"] and "scroll_id" not in q for q in queries)


def test_since_stops_at_the_first_older_dataset(server):
    src = source(server)
    since = datetime(2025, 8, 25, 15, 30, tzinfo=timezone.utc)
    records, listing = listed(src, since=since, page_size=2)
    want = {r["resource"]["id"] for r in real_results() if parse_timestamp(r["resource"]["updatedAt"]) > since}
    assert {r.source_id for r in records} == want == {"85ca-t3if", "ygr5-vcbg", "n4j6-wkkf", "5k2z-suxx"}
    assert not listing.complete          # not the whole catalogue: nothing may be removed on it
    assert len(server.catalog_requests()) == 3   # 2 + 2 + the page holding the first older one


def test_a_since_older_than_everything_lists_everything_and_is_complete(server):
    records, listing = listed(source(server), since=datetime(2000, 1, 1, tzinfo=timezone.utc), page_size=5)
    assert len(records) == 21 and listing.complete


def test_many_pages_of_synthetic_records(server):
    for result in synthetic(250):
        server.put(result)
    src = source(server)
    records, listing = listed(src, page_size=100)
    assert len(records) == len({r.source_id for r in records}) == 271 and listing.complete
    assert len(server.catalog_requests()) == 3 and src.total == 271


def test_a_portal_that_ignores_offset_rejects_since(server):
    server.ignore_offset = True   # the second page is the first again: newer than the one before it
    with pytest.raises(FilterRejected, match="ignored order=updatedAt DESC"):
        listed(source(server), since=datetime(2000, 1, 1, tzinfo=timezone.utc), page_size=5)
    assert len(server.catalog_requests()) == 2


def test_a_stuck_scroll_id_is_cut_not_looped(server, caplog):
    server.ignore_scroll = True
    src = source(server)
    records, listing = listed(src, page_size=5)
    assert [r.source_id for r in records] == sorted(r["resource"]["id"] for r in real_results())[:5]
    assert not listing.complete
    assert len(server.catalog_requests()) == 2
    assert "the scroll_id did not advance" in caplog.text and "portal chicago" in caplog.text


def test_a_portal_that_ignores_the_order_rejects_since(server):
    server.ignore_order = True
    with pytest.raises(FilterRejected, match="ignored order=updatedAt DESC"):
        listed(source(server), since=datetime(2025, 1, 1, tzinfo=timezone.utc))
    # a full listing does not need the order
    server.requests.clear()
    records, listing = listed(source(server), page_size=7)
    assert len(records) == 21 and listing.complete


def test_an_incremental_listing_that_would_pass_the_api_window_is_rejected(server, monkeypatch):
    import harvester.sources.socrata as socrata

    monkeypatch.setattr(socrata, "MAX_WINDOW", 10)
    monkeypatch.setattr("harvester.testing.socrata_portal.MAX_WINDOW", 10)
    with pytest.raises(FilterRejected, match="only 10 results deep"):
        listed(source(server), since=datetime(2000, 1, 1, tzinfo=timezone.utc), page_size=4)
    assert [q["limit"] for q in server.catalog_requests()] == [["4"], ["4"], ["2"]]   # never past the window
    # the full listing the pipeline falls back to scrolls past the window
    server.requests.clear()
    records, listing = listed(source(server), page_size=4)
    assert len(records) == 21 and listing.complete


def test_twelve_thousand_datasets_past_the_capped_count_are_listed_exactly(server):
    # issue 36: resultSetSize says 10000 for 12,000 (as the 2025 recordings do for any query
    # matching more); the listing used to stop at 10,000 and call itself complete
    for result in small(12_000 - 21):
        server.put(result)
    src = source(server)
    records, listing = listed(src, page_size=1000)
    ids = [r.source_id for r in records]
    assert listing.complete and len(ids) == len(set(ids)) == 12_000
    assert ids == sorted(ids) and set(ids) == set(server.records)
    assert src.total == 10_000 and not src.capabilities.count.is_exact(src.total)
    queries = server.catalog_requests()
    # 12 full pages, then the empty page that proves the end (the count cannot); never an offset
    assert len(queries) == 13 and all("offset" not in q and "order" not in q for q in queries)
    server.requests.clear()
    listed_ids = [i for page in source(server).list_ids(1000) for i, _ in page.ids]
    assert listed_ids == ids


def test_a_server_capping_its_page_size_is_listed_whole(server):
    # the server sends at most 7 a page whatever limit asks: a short page is not the end
    server.max_page_size = 7
    records, listing = listed(source(server), page_size=20)
    assert sorted(r.source_id for r in records) == sorted(r["resource"]["id"] for r in real_results())
    assert listing.complete
    assert len(server.catalog_requests()) == 3   # 7 + 7 + 7: the exact count (21) reached
    # newest first (an incremental listing reaching the end) as well
    server.requests.clear()
    records, listing = listed(source(server), since=datetime(2000, 1, 1, tzinfo=timezone.utc), page_size=20)
    assert len(records) == 21 and listing.complete
    assert [q["offset"] for q in server.catalog_requests()] == [["0"], ["7"], ["14"]]


def test_a_capped_page_size_over_a_capped_count_is_read_to_the_empty_page(server):
    for result in small(12_000 - 21):
        server.put(result)
    server.max_page_size = 500
    src = source(server)
    records, listing = listed(src, page_size=1000)
    assert listing.complete and len({r.source_id for r in records}) == len(records) == 12_000
    assert len(server.catalog_requests()) == 24 + 1   # pages of 500, then the empty one


def test_the_local_api_keeps_the_documented_limits(server):
    for result in small(12_000 - 21):
        server.put(result)
    fetcher = HttpFetcher(server.base_url, max_retries=0, backoff=0, sleep=lambda s: None)
    src = SocrataSource(server.base_url, fetcher=fetcher, portal="chicago")
    # offset + limit past 10,000: 400
    with pytest.raises(SourceError, match="HTTP 400"):
        src._get(src._params(1000, 9_500))
    assert src._get(src._params(500, 9_500))["resultSetSize"] == 10_000   # capped
    # order with scroll_id: 400
    with pytest.raises(SourceError, match="HTTP 400"):
        src._get({**src._scroll_params(10, ""), "order": "updatedAt DESC"})
    assert src.count() == 10_000
    assert len(src._get(src._scroll_params(10_000, ""))["results"]) == 10_000
    server.max_page_size = 100
    assert len(src._get(src._scroll_params(1000, ""))["results"]) == 100


def test_the_kinds_count_is_capped_at_ten_thousand():
    from harvester.config.portals import SOCRATA
    from harvester.sources import CAPABILITIES
    from harvester.sources.base import CountKind

    assert SocrataSource.capabilities == CAPABILITIES[SOCRATA]
    assert SocrataSource.capabilities.count == CountKind("capped", 10_000)
    count = SocrataSource.capabilities.count
    assert [count.is_exact(n) for n in (0, 9_999, 10_000, 150_680, None)] == [True, True, False, False, False]
    with pytest.raises(ValueError, match="a capped count needs a positive cap, not cap=None"):
        CountKind("capped")
    with pytest.raises(ValueError, match="count kind 'rough' is not one of: exact, capped, absent"):
        CountKind("rough")


def test_503_and_429_are_retried(server):
    server.fail_next(2, 503)
    server.fail_next(1, 429, retry_after="0")
    server.fail_next(1, truncated=True)
    src = source(server, max_retries=4)
    records, listing = listed(src)
    assert len(records) == 21 and listing.complete
    assert src.requests_made == 5


def test_5xx_that_outlives_the_retries_is_transient(server):
    server.fail_next(10, 502)
    with pytest.raises(SourceUnavailable, match="portal chicago"):
        listed(source(server))


def test_404_is_terminal_at_once_naming_portal_and_url(server):
    src = SocrataSource(server.base_url + "/nowhere/api/catalog/v1?domains=" + DOMAIN,
                        fetcher=HttpFetcher(server.base_url, max_retries=3, backoff=0, sleep=lambda s: None),
                        portal="chicago")
    with pytest.raises(SourceError) as err:
        listed(src)
    assert not err.value.transient
    message = str(err.value)
    assert "portal chicago" in message and f"{server.base_url}/nowhere/api/catalog/v1" in message and "404" in message
    assert src.requests_made == 1


def test_an_answer_that_is_not_a_catalogue_page_is_terminal(server, monkeypatch):
    monkeypatch.setattr(server, "_answer", lambda query: (200, {"error": "nope"}))
    with pytest.raises(SourceError, match="not a Discovery API answer"):
        listed(source(server))


# -- reconciliation --------------------------------------------------------------------------------
def test_count_is_one_small_request(server):
    src = source(server)
    assert src.count() == 21 and src.requests_made == 1
    assert server.catalog_requests()[0]["limit"] == ["1"]


def test_fetch_by_ids_asks_the_ids_filter_as_the_recorded_request_did(server):
    recorded = json.loads((DATA / "chicago_ids.json").read_text())["results"]
    src = source(server)
    pages = list(src.fetch_by_ids(["zidz-sdfj", "xzkq-xp2w", "gone-0000"], per_request=2))
    got = [r.source_id for page in pages for r in page]
    assert sorted(got) == sorted(r["resource"]["id"] for r in recorded)   # the one gone is left out
    assert [r.metadata_hash for r in pages[0]] == [normalize(r, src.catalog_url).metadata_hash for r in recorded
                                                   if r["resource"]["id"] in {x.source_id for x in pages[0]}]
    assert [q["ids"] for q in server.catalog_requests()] == [["zidz-sdfj,xzkq-xp2w"], ["gone-0000"]]


def test_list_ids_carries_the_ids_and_times_of_the_records(server):
    pages = list(source(server).list_ids(8))
    ids = [i for page in pages for i in page.ids]
    assert len(ids) == 21 and all(page.records for page in pages)
    for page in pages:
        assert page.ids == [(r.source_id, r.metadata_modified) for r in page.records]
    want = {r["resource"]["id"]: parse_timestamp(r["resource"]["updatedAt"]) for r in real_results()}
    assert dict(ids) == want


def test_list_ids_refuses_a_partial_listing(server):
    server.ignore_scroll = True
    with pytest.raises(SourceError, match="could not be read to its end"):
        list(source(server).list_ids(5))
