"""The STAC source (harvester.sources.stac) on the recorded answers of ../shared/portal-samples/stac
(FedEO's paged /collections, earth-search's landing page and collections, CBERS' static catalog, the
hand-made STAC 1.0/1.1 collections) and over real HTTP against the local STAC server
(harvester.testing.stac_portal): the mapping, a landing page told from a static catalog, paging by
next links of each recorded server's style, a page capped below the limit asked, the static walk,
loops and hostile answers cut or refused, faults retried, a 404 terminal, and `harvester validate`."""
from __future__ import annotations

import json
import logging
import math
from datetime import datetime, timezone

import pytest

from harvester.config.portals import Portal
from harvester.http import HttpFetcher, RetriesExhausted
from harvester.pipeline import validate as v
from harvester.sources import source_for
from harvester.sources.base import Listing, SourceError
from harvester.sources.stac import StacSource, normalize, to_package
from harvester.testing.samples import portal_sample
from harvester.testing.stac_portal import (CBERS, EARTH_SEARCH, FEDEO, NOT_FOUND, StacServer, cassette,
                                           cbers_catalog, derived_collections, real_collections)

FEDEO_URL = "https://emc.spacebel.be/collections?limit=10&q=sentinel"


def fedeo_pages() -> list[dict]:
    return [i["body"] for i in cassette(FEDEO)]


def ceres(version: str) -> dict:
    return json.loads(portal_sample("stac", f"collections-stac-{version}-handmade-ceres.json").read_text())


def source(url: str, **kw) -> StacSource:
    fetcher = HttpFetcher(url, max_retries=kw.pop("max_retries", 3), backoff=0.01, sleep=lambda s: None)
    return StacSource(url, fetcher=fetcher, **kw)


def listed(src, page_size=100):
    listing = Listing()
    records = [r for page in src.iter_records(None, page_size, listing) for r in page]
    return records, listing


def codes(record) -> set[str]:
    return {p.code for p in record.problems}


# -- the mapping of the recorded collections ------------------------------------------------------
def test_a_recorded_fedeo_collection_maps_field_by_field():
    doc = fedeo_pages()[0]["collections"][0]
    assert doc["id"] == "EOP:ESA:Sentinel-6"
    pkg, warnings = to_package(doc, FEDEO_URL, "https://emc.spacebel.be/collections/EOP:ESA:Sentinel-6")
    assert warnings == []
    assert pkg["title"] == "Sentinel-6 Products" and pkg["notes"].startswith("Copernicus Sentinel-6 Michael")
    assert [t["name"] for t in pkg["tags"]][:3] == ["FedEO", "SCIHUB", "DIF10"]
    assert pkg["license_id"] == "various"
    assert pkg["metadata_created"] == "2024-01-02T00:00:00.00Z" and pkg["metadata_modified"] == doc["updated"]
    assert pkg["extras"]["extent"]["temporal"]["interval"] == [["2021-10-09T00:00:00.000Z", None]]  # open end
    assert pkg["extras"]["extent"]["spatial"]["bbox"] == [[-180, -90, 180, 90]]
    for key in ("providers", "summaries", "stac_version", "links", "assets"):
        assert key in pkg["extras"]
    assert {r["name"] for r in pkg["resources"]} >= {"Search client", "ISO 19139 metadata"}
    record = normalize(doc, FEDEO_URL, "https://emc.spacebel.be/collections/EOP:ESA:Sentinel-6", "en")
    assert record.ok and record.source_id == "EOP:ESA:Sentinel-6" and record.language == "en"
    assert record.metadata_modified == datetime.fromisoformat(doc["updated"].replace("Z", "+00:00"))
    assert record.organization == next(p["name"] for p in doc["providers"] if "producer" in p.get("roles", []))


def test_earth_search_collections_have_no_updated_and_a_proprietary_licence():
    page = next(i["body"] for i in cassette(EARTH_SEARCH) if "collections" in i["body"])
    assert page["context"]["matched"] == len(page["collections"]) == 9
    records = [normalize(c, "https://earth-search.aws.element84.com/v1/collections", "x") for c in page["collections"]]
    assert all(r.ok for r in records)
    naip = next(r for r in records if r.source_id == "naip")
    assert naip.metadata_modified is None and naip.raw["license_id"] == "proprietary"
    assert naip.url.startswith("https://earth-search.aws.element84.com/v1/collections/naip")  # its self link
    assert naip.organization == "USDA Farm Service Agency" and "tif" in {t.lower() for t in naip.tags} | {"tif"}


def test_cbers_collections_lack_titles_their_ids_stand_for_them_with_a_warning():
    catalog, collections = cbers_catalog()
    url = "https://cbers-stac-1-0.s3.amazonaws.com/CBERS4MUX/collection.json"
    record = normalize(collections[0], url, url)
    assert record.ok and record.title == "CBERS4MUX" and "title-from-identifier" in codes(record)
    assert record.raw["license_id"] == "CC-BY-SA-3.0"
    assert record.organization == "Instituto Nacional de Pesquisas Espaciais, INPE"  # the producer, not the host
    assert record.url == url  # no self link: the document's own URL


def test_stac_1_1_relative_self_link_and_created_updated():
    page = ceres("1.1")
    doc = page["collections"][0]
    record = normalize(doc, "https://catalog.test/collections?limit=1", "https://catalog.test/collections/x")
    assert record.url == "https://catalog.test/landsat-c2-l2"  # ./landsat-c2-l2 against the page
    assert record.raw["metadata_created"] == "2020-12-01T00:00:00Z"
    assert record.metadata_modified == datetime(2026, 6, 15, 12, tzinfo=timezone.utc)
    assert record.raw["license_id"] == "PDDL-1.0" and record.organization == "USGS"
    assert page["links"][0]["method"] == "GET"
    ten = normalize(ceres("1.0")["collections"][0], "https://catalog.test/collections", "x")
    assert {r["url"] for r in ten.raw["resources"]} == {
        "https://catalog.test/thumb.png", "https://catalog.test/sentinel-2-l2a.zarr",
        "https://catalog.test/collections/sentinel-2-l2a/items"}
    assert ten.organization == "ESA"


def test_unusable_collections_are_their_own_failed_records_with_codes():
    doc = ceres("1.1")["collections"][0]
    no_id = dict(doc, id=None)
    assert codes(normalize(no_id, "https://x/", "https://x/")) == {"no-identifier"}
    assert codes(normalize(["not", "a", "collection"], "https://x/", "https://x/")) == {"not-an-object"}
    bad_title = normalize(dict(doc, title={"en": "x"}), "https://x/", "https://x/")
    assert not bad_title.ok and codes(bad_title) == {"wrong-type"} and "landsat-c2-l2" in bad_title.error
    bad_date = normalize(dict(doc, updated="last tuesday"), "https://x/", "https://x/")
    assert bad_date.ok and "bad-optional-date" in codes(bad_date)
    assert bad_date.metadata_modified == datetime(2020, 12, 1, tzinfo=timezone.utc)  # created stands for it
    declared = normalize(dict(doc, language={"code": "pt-BR", "name": "Português"}), "https://x/", "https://x/", "en")
    assert declared.language == "pt"  # pt-BR's language, which picks the text-search configuration


def test_an_edit_to_the_extent_changes_the_metadata_hash_and_not_the_text():
    doc = ceres("1.1")["collections"][0]
    moved = json.loads(json.dumps(doc))
    moved["extent"]["temporal"]["interval"] = [["1982-08-22T00:00:00Z", "2025-01-01T00:00:00Z"]]
    a, b = normalize(doc, "https://x/", "https://x/"), normalize(moved, "https://x/", "https://x/")
    assert a.metadata_hash != b.metadata_hash and a.content_hash == b.content_hash


def test_the_recorded_landing_pages_are_told_apis_and_cbers_a_static_catalog():
    from harvester.sources.stac import conforms_to_collections, is_collection, links_of

    earth = next(i["body"] for i in cassette(EARTH_SEARCH) if "conformsTo" in i["body"])
    planetary = cassette("landing-planetary-computer-2025-07-31.vcr.yaml")[0]["body"]
    for landing, data in ((earth, "https://earth-search.aws.element84.com/v1/collections"),
                          (planetary, "https://planetarycomputer.microsoft.com/api/stac/v1/collections")):
        assert conforms_to_collections(landing) and links_of(landing, "data")[0]["href"] == data
        assert len(links_of(landing, "child")) >= 9 and not is_collection(landing)  # listed, not walked
    catalog, collections = cbers_catalog()
    assert not conforms_to_collections(catalog) and not links_of(catalog, "data")
    assert all(is_collection(c) and "type" not in c for c in collections)  # STAC 1.0.0-beta.2: no type


# -- an API over HTTP -----------------------------------------------------------------------------
@pytest.mark.parametrize("paging,counts", [("startRecord", "numberMatched"), ("token", "context"), ("token", None)])
def test_the_api_from_its_landing_page_by_next_links(paging, counts):
    collections = derived_collections(250)
    with StacServer(collections, paging=paging, counts=counts) as server:
        src = source(server.url)
        records, listing = listed(src, page_size=100)
        assert sorted(r.source_id for r in records) == sorted(c["id"] for c in collections)
        assert all(r.ok for r in records) and listing.complete and src.mode == "api"
        assert src.total == (None if counts is None else 250)
        assert server.requests[0] == "/" and len(server.collection_requests()) == 3
        if paging == "token":  # the relative next link, method GET, resolved against the page
            assert "token=" in server.collection_requests()[-1]
        else:
            assert "startRecord=201" in server.collection_requests()[-1]
        assert records[0].url == f"{server.base_url}/collections/{records[0].source_id}"


def test_a_limit_above_the_servers_cap_is_paged_at_the_cap_to_the_end():
    collections = derived_collections(230)
    with StacServer(collections, max_limit=100) as server:
        src = source(server.base_url + "/collections")     # the listing url itself
        records, listing = listed(src, page_size=1000)
        assert len({r.source_id for r in records}) == 230 and listing.complete
        assert server.requests[0] == "/collections?limit=1000" and len(server.collection_requests()) == 3


def test_the_real_collections_served_as_recorded_are_all_read():
    real = real_collections()
    assert len(real) == 41
    with StacServer(real) as server:
        records, listing = listed(source(server.url), page_size=10)
    assert {r.source_id for r in records} == {c["id"] for c in real} and listing.complete
    assert sum("title-from-identifier" in codes(r) for r in records) == len(CBERS)


def test_a_next_link_looping_back_is_cut_and_not_complete(caplog):
    caplog.set_level(logging.WARNING, logger="harvester")
    for paging in ("startRecord", "token"):
        with StacServer(derived_collections(50), paging=paging) as server:
            server.loop_after = 2
            src = source(server.url)
            records, listing = listed(src, page_size=10)
            assert len(records) == 20 and not listing.complete and src.cut
            # startRecord=1 is a URL not read before (page 1 had none): read, and its page repeats
            # page 1; the token link back to ?limit=10 is refused before any request
            assert len(server.collection_requests()) == (3 if paging == "startRecord" else 2)
    assert "repeats the collections of an earlier page" in caplog.text and "already read" in caplog.text


def test_a_collection_removed_while_an_offset_paged_listing_is_read_leaves_it_incomplete():
    # FedEO pages by offset (startRecord): a removal between pages 1 and 2 shifts the rest back,
    # and the collection that moved onto page 1 is never shown. Page 1 counted 30; 29 distinct came.
    ids = sorted(c["id"] for c in derived_collections(30))  # the server's order
    with StacServer(derived_collections(30), max_limit=10) as server:
        original = server.answer

        def answer(path, query):
            if "startRecord" in query and ids[5] in server.collections:
                server.collections.pop(ids[5])
            return original(path, query)
        server.answer = answer
        src = source(server.url)
        records, listing = listed(src, page_size=10)
    assert ids[10] not in {r.source_id for r in records}  # the one skipped
    assert (len(records), src.total, listing.complete) == (29, 29, False)
    assert "29 distinct collections of the 30" in src.cut


def test_a_next_link_to_be_posted_is_a_clear_error():
    with StacServer(derived_collections(30)) as server:
        server.post_next = True
        with pytest.raises(SourceError, match="method 'POST'.*by GET only"):
            listed(source(server.url), page_size=10)


def test_a_next_link_to_another_host_is_not_followed():
    with StacServer(derived_collections(30)) as server:
        page = server._page({"limit": ["10"]})[1]
        page["links"] = [{"rel": "next", "href": "http://elsewhere.example/collections?page=2"}]
        other = StacServer([])
        other.answer = lambda path, query: (200, page)  # the listing page of a server that links away
        with other:
            src = source(other.base_url + "/collections")
            records, listing = listed(src)
    assert len(records) == 10 and not listing.complete and "another host" in src.cut


def test_a_collection_listed_twice_is_a_duplicate_failed_record():
    with StacServer(derived_collections(20), max_limit=10) as server:
        first = server._page({"limit": ["10"]})[1]
        original = server.answer

        def answer(path, query):  # page 2 repeats one collection of page 1
            status, doc = original(path, query)
            if "startRecord" in query:
                doc["collections"][0] = first["collections"][0]
            return status, doc
        server.answer = answer
        records, listing = listed(source(server.url), page_size=10)
    dup = [r for r in records if not r.ok]
    assert len(dup) == 1 and codes(dup[0]) == {"duplicate-identifier"}
    assert not listing.complete  # 19 distinct of the 20 counted


def test_transient_faults_are_retried():
    with StacServer(derived_collections(30)) as server:
        server.fail_next(1, status=503)
        server.fail_next(1, status=429, retry_after="0")
        server.fail_next(1, truncate=True)
        src = source(server.url)
        records, listing = listed(src, page_size=10)
        assert len(records) == 30 and listing.complete
        assert src.requests_made == len(server.requests) == 1 + 3 + 3


def test_faults_outliving_the_retries_are_transient():
    with StacServer(derived_collections(5)) as server:
        server.fail_next(5, status=502)
        with pytest.raises(RetriesExhausted, match="failed after 3 attempts"):
            listed(source(server.url, max_retries=2))


def test_a_404_is_terminal_at_once_naming_the_portal_and_url():
    recorded = cassette(NOT_FOUND)[-1]
    assert recorded["status"] == 404 and recorded["body"] == {"code": "NotFound", "description": "Not Found"}
    with StacServer([]) as server:
        url = server.base_url + "/no/such/catalog.json"
        with pytest.raises(SourceError, match="portal x: GET .*/no/such/catalog.json: HTTP 404 Not Found: no STAC"):
            listed(source(url, portal="portal x"))
        assert len(server.requests) == 1


def test_a_page_that_never_ends_is_refused_at_the_size_cap(monkeypatch):
    monkeypatch.setenv("HARVESTER_FETCH_MAX_BYTES", "1MB")
    with StacServer(derived_collections(5)) as server:
        server.endless = True
        with pytest.raises(SourceError, match="larger than 1MB"):
            listed(source(server.url))


# -- a static catalog -----------------------------------------------------------------------------
def test_the_recorded_cbers_catalog_is_walked_by_relative_child_links():
    catalog, collections = cbers_catalog()
    assert [link["href"] for link in catalog["links"] if link["rel"] == "child"][0] == "./CBERS4MUX/collection.json"
    with StacServer(collections) as server:
        src = source(server.static_url)
        records, listing = listed(src)
        assert sorted(r.source_id for r in records) == sorted(CBERS) and listing.complete and src.mode == "static"
        assert len(server.requests) == 5  # the root and each collection once
        mux = next(r for r in records if r.source_id == "CBERS4MUX")
        assert mux.url == f"{server.base_url}/static/CBERS4MUX/collection.json"


def test_nested_catalogs_are_walked_and_a_child_loop_read_once(caplog):
    caplog.set_level(logging.WARNING, logger="harvester")
    collections = derived_collections(95)
    with StacServer(collections, static_group=20) as server:
        server.child_loop = True  # every collection links the root back as a child
        src = source(server.static_url)
        records, listing = listed(src, page_size=30)
        assert len(records) == 95 and len({r.source_id for r in records}) == 95 and listing.complete
        assert len(server.requests) == 1 + math.ceil(95 / 20) + 95
    assert "lead back to documents already read (a loop)" in caplog.text


def test_an_unreadable_child_leaves_the_walk_incomplete(caplog):
    collections = derived_collections(10)
    with StacServer(collections) as server:
        server.missing_children = {collections[3]["id"]}
        original = server.answer

        def answer(path, query):  # and one child answers a JSON array
            if collections[5]["id"] in path:
                return 200, ["not", "a", "catalog"]
            return original(path, query)
        server.answer = answer
        src = source(server.static_url)
        records, listing = listed(src)
    assert len(records) == 8 and not listing.complete
    assert "HTTP 404" in caplog.text and "the answer is a JSON list, not a STAC document" in caplog.text


def test_an_endless_chain_of_catalogs_is_cut_at_the_depth_bound():
    with StacServer([]) as server:
        def answer(path, query):  # each catalog links a deeper one
            depth = path.count("/")
            return 200, {"type": "Catalog", "id": f"c{depth}", "description": "deeper",
                         "links": [{"rel": "child", "href": "./next/catalog.json"}]}
        server.answer = answer
        src = source(server.base_url + "/catalog.json")
        src.max_depth = 8
        records, listing = listed(src)
        assert records == [] and not listing.complete and "child links deep" in src.cut
        assert len(server.requests) == 9


def test_an_item_only_catalog_has_no_datasets_and_is_complete():
    with StacServer([]) as server:
        server.answer = lambda path, query: (200, {
            "type": "Catalog", "id": "items", "description": "items only", "stac_version": "1.0.0",
            "links": [{"rel": "item", "href": f"./item-{i}.json"} for i in range(3)]})
        records, listing = listed(source(server.base_url + "/catalog.json"))
        assert records == [] and listing.complete and len(server.requests) == 1


# -- the registry and validation ------------------------------------------------------------------
def test_source_for_builds_it_with_the_portals_name_and_language():
    portal = Portal(name="eo", url="https://earth-search.aws.element84.com/v1", type="stac", language="english")
    src = source_for(portal)
    assert isinstance(src, StacSource) and src.portal == "eo" and src.language == "en"
    assert not src.capabilities.incremental and not src.capabilities.reconcile


def test_harvester_validate_reads_an_api_and_a_static_catalog():
    with StacServer(derived_collections(25) + cbers_catalog()[1]) as server:
        report = v.validate_url(server.url, "stac", pages=5, page_size=10)
        assert (report.records, report.failed, report.complete) == (29, 0, True)
        assert any(g["code"] == "title-from-identifier" for g in report.groups)
        static = v.validate_url(server.static_url, "stac")
        assert (static.records, static.complete) == (29, True)


def test_harvester_validate_reads_a_saved_collections_page_and_a_collection_file(tmp_path):
    page = tmp_path / "collections.json"
    page.write_text(json.dumps(fedeo_pages()[0]))
    report = v.validate_path(page, "stac")
    assert (report.records, report.failed) == (10, 0) and not report.complete  # its next page is not in the file
    one = tmp_path / "collection.json"
    one.write_text(json.dumps(cbers_catalog()[1][0]))
    report = v.validate_path(one, "stac")
    assert (report.records, report.failed) == (1, 0)
    assert {r["code"] for r in report.rows} >= {"title-from-identifier"}


def test_harvester_validate_tells_stac_from_the_answer_without_type(tmp_path):
    with StacServer(derived_collections(12)) as server:
        report = v.validate_url(server.url, pages=5, page_size=10)
        assert (report.kind, report.records, report.complete) == ("stac", 12, True)
        assert report.guessed == "stac, from the answer's content"
    one = tmp_path / "collection.json"
    one.write_text(json.dumps(ceres("1.1")["collections"][0]))
    assert v.validate_path(one).kind == "stac"
