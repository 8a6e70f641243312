"""The OpenDataSoft source (harvester.sources.opendatasoft) on the real fixtures of
tests/data/opendatasoft, over real HTTP to a local Explore v2.1 catalogue
(harvester.testing.opendatasoft_portal, which keeps the API's documented limits): mapping, paging,
the exports endpoint past the 10,000 offset cap (full, incremental and identifier listings, a
catalogue growing past it, an export cut short), complete only on proof, a looping portal cut,
errors, and a modified-since filter the portal ignores."""
from __future__ import annotations

import copy
import json
import re
from datetime import datetime, timezone
from pathlib import Path

import pytest

from harvester.domain.dataset import clean_text
from harvester.http import HttpFetcher, RetriesExhausted
from harvester.sources.base import FilterRejected, Listing, SourceError
from harvester.sources.opendatasoft import ListingCut, OpenDataSoftSource, modified_filter, portal_root
from harvester.testing.opendatasoft_portal import CATALOG, EXPORT, OpenDataSoftPortal, fixture_datasets

DATA = Path(__file__).resolve().parents[1] / "data" / "opendatasoft"
RTE = json.loads((DATA / "rte-catalog-v2.0.json").read_text(encoding="utf-8"))
UDATA = json.loads((DATA / "udata-ods-search-v1.0.json").read_text(encoding="utf-8"))
RTE_ID = "evolution_region_longueurs_circuits_files@rte"


def fixture_ids() -> set[str]:
    """The fixtures' dataset ids, read from the files alone."""
    return {d["dataset"]["dataset_id"] for d in RTE["datasets"]} | {d["datasetid"] for d in UDATA["datasets"]}


@pytest.fixture
def portal():
    with OpenDataSoftPortal(fixture_datasets()) as server:
        yield server


def source_for(portal, **kw) -> OpenDataSoftSource:
    fetcher = HttpFetcher(portal.base_url, max_retries=kw.pop("max_retries", 3), sleep=lambda s: None, timeout=10)
    return OpenDataSoftSource(portal.base_url, fetcher=fetcher, **kw)


def harvest(source, since=None, page_size=100):
    listing = Listing()
    records = [r for page in source.iter_records(since, page_size, listing) for r in page]
    return records, listing


def by_id(records):
    return {r.source_id: r for r in records}


def numbered(n: int, modified: str = "2024-01-01T00:00:00+00:00") -> list[dict]:
    """``n`` datasets copied from the first real fixture, ``ds-00000``..., modified at ``modified``."""
    template = fixture_datasets()[0]
    out = []
    for i in range(n):
        ds = copy.deepcopy(template)
        ds["dataset_id"] = f"ds-{i:05d}"
        ds["metas"]["default"].update(title=f"Dataset {i}", modified=modified)
        out.append(ds)
    return out


def listed(source, since=None, page_size=100, select=None):
    listing = Listing()
    ids = [dataset_id for page in source.iter_items(since, page_size, listing, select=select)
           for dataset_id in (d["dataset_id"] for d in page)]
    return ids, listing


def within_the_documented_limits(server):
    """No request the real API would refuse: limit at most 100 and offset + limit within the cap on
    the records endpoint, no comparison of dataset_id but `=`."""
    for q in server.catalog_requests():
        assert int(q["limit"]) <= 100 and int(q["offset"]) + int(q["limit"]) <= server.offset_cap, q
    assert not any(op in q.get("where", "") for _, q in server.requests for op in ("dataset_id >", "dataset_id <"))


# -- mapping of the real fixtures ------------------------------------------------------------------
def test_the_real_v2_dataset_maps_to_a_package(portal):
    records, listing = harvest(source_for(portal))
    assert set(by_id(records)) == fixture_ids() and listing.complete
    rec = by_id(records)[RTE_ID]
    meta = RTE["datasets"][0]["dataset"]["metas"]["default"]
    assert rec.ok and rec.title == clean_text(meta["title"])
    assert rec.description == clean_text(meta["description"]) and "<p>" not in rec.description
    assert rec.description.startswith("Evolution régionale annuelle des longueurs")
    assert rec.tags == sorted(meta["keyword"]) and rec.organization == "RTE"
    assert rec.metadata_modified == datetime(2016, 7, 4, 12, 28, 31, tzinfo=timezone.utc)
    assert rec.url == f"{portal.base_url}/explore/dataset/{RTE_ID}/"
    pkg = rec.raw
    assert pkg["license_id"] == "Licence Ouverte (Etalab)"
    assert [g["name"] for g in pkg["groups"]] == ["Réseau", "Territoires et régions"]
    api = f"{portal.base_url}/api/explore/v2.1/catalog/datasets/{RTE_ID}"
    assert [r["url"] for r in pkg["resources"]] == [f"{api}/exports/csv", f"{api}/exports/json", f"{api}/records"]
    extras = {e["key"]: e["value"] for e in pkg["extras"]}
    assert extras["data_processed"] == "2016-09-02T11:52:15+00:00"
    assert extras["source_domain_title"] == "OPEN DATA RTE" and extras["records_count"] == "180"
    assert json.loads(extras["features"]) == ["geo", "analyze", "timeserie"]
    assert json.loads(extras["fields"])[0]["name"] == "circ_sout_63_kv_km"


def test_the_v1_metadata_quirks_map(portal):
    records = by_id(harvest(source_for(portal))[0])
    a, b, c, d = (records[k] for k in ("test-a", "test-b", "test-c", "test-d"))
    assert a.description == "test-a-description" and a.organization == "test" and a.tags == ["keyword1", "keyword2"]
    assert [g["name"] for g in a.raw["groups"]] == ["Culture, Heritage", "Environment"]  # commas inside a theme
    # a single keyword written as a string, a theme written as one string
    assert b.tags == ["keyword1"] and len(b.raw["groups"]) == 1
    assert c.description == "" and c.organization is None and c.raw["license_id"] is None
    assert [r["format"] for r in c.raw["resources"]] == ["CSV", "JSON"]          # has_records false: no records API
    extras = {e["key"]: e["value"] for e in d.raw["extras"]}
    assert extras["metas.inspire.contact_email"] == "tnt@acme.com"                 # another template, kept
    assert all(r.ok for r in records.values())


def test_an_edit_anywhere_changes_the_metadata_hash(portal):
    before = by_id(harvest(source_for(portal))[0])
    portal.datasets["test-d"]["metas"]["inspire"]["contact_email"] = "other@acme.com"
    portal.datasets["test-a"]["metas"]["default"]["data_processed"] = "2016-01-01T00:00:00+00:00"
    after = by_id(harvest(source_for(portal))[0])
    changed = {k for k in before if before[k].metadata_hash != after[k].metadata_hash}
    assert changed == {"test-a", "test-d"}
    assert all(before[k].content_hash == after[k].content_hash for k in before)


def test_a_result_without_title_or_id_is_a_failed_record(portal):
    broken = copy.deepcopy(portal.datasets["test-c"])
    broken["dataset_id"] = "zz-untitled"
    del broken["metas"]["default"]["title"]
    portal.put(broken)
    records = by_id(harvest(source_for(portal))[0])
    assert not records["zz-untitled"].ok and "'zz-untitled' has no title" in records["zz-untitled"].error
    assert portal.base_url in records["zz-untitled"].error


def test_the_portal_address_may_be_given_with_an_api_path():
    assert portal_root("https://data.example.org/api/explore/v2.1/catalog/datasets") == "https://data.example.org"
    assert portal_root("https://data.example.org/explore/") == "https://data.example.org"
    assert portal_root("https://data.example.org/") == "https://data.example.org"


# -- paging -----------------------------------------------------------------------------------------
def test_pages_by_limit_and_offset_ordered_by_dataset_id(portal):
    source = source_for(portal)
    records, listing = harvest(source, page_size=2)
    assert [r.source_id for r in records] == sorted(fixture_ids()) and listing.complete
    asked = portal.catalog_requests()
    assert [(q["limit"], q["offset"], q["order_by"]) for q in asked] == [("2", "0", "dataset_id"),
                                                                           ("2", "2", "dataset_id"),
                                                                           ("2", "4", "dataset_id")]
    assert source.total == len(fixture_ids()) and source.requests_made == 3


def test_a_page_size_over_the_api_maximum_is_asked_as_100(portal):
    harvest(source_for(portal), page_size=1000)
    assert [q["limit"] for q in portal.catalog_requests()] == ["100"]


@pytest.mark.slow
def test_12000_datasets_are_listed_exactly_the_rest_through_the_export():
    with OpenDataSoftPortal(numbered(12_000)) as server:
        source = source_for(server)
        ids, listing = listed(source)
        assert ids == [f"ds-{i:05d}" for i in range(12_000)] and listing.complete and source.total == 12_000
        assert source.listed == 12_000
        # the first page (its total_count decides), then the whole catalogue in one export
        [page], [export] = server.catalog_requests(), server.export_requests()
        assert (page["limit"], page["offset"]) == ("100", "0")
        assert export == {"order_by": "dataset_id"} and source.requests_made == 2
        within_the_documented_limits(server)
        assert source.bytes_received > 12_000 * 1_000      # the streamed export's bytes are counted


def test_a_total_exactly_at_the_cap_is_exported_and_one_below_it_paged():
    with OpenDataSoftPortal(numbered(20)) as server:
        server.offset_cap = 20                               # the API's 10,000, scaled down
        ids, listing = listed(source_for(server, offset_cap=20), page_size=5)
        assert ids == [f"ds-{i:05d}" for i in range(20)] and listing.complete
        assert len(server.catalog_requests()) == 1 and len(server.export_requests()) == 1
        server.remove("ds-00019")
        server.requests.clear()
        ids, listing = listed(source_for(server, offset_cap=20), page_size=5)
        assert ids == [f"ds-{i:05d}" for i in range(19)] and listing.complete
        assert [q["offset"] for q in server.catalog_requests()] == ["0", "5", "10", "15"]
        assert server.export_requests() == []
        within_the_documented_limits(server)


def test_a_catalogue_growing_past_the_window_while_paged_goes_on_through_the_export():
    with OpenDataSoftPortal(numbered(18)) as server:
        server.offset_cap = 20
        source = source_for(server, offset_cap=20)
        listing = Listing()
        pages = source.iter_items(None, 5, listing)
        first = [d["dataset_id"] for d in next(pages)]
        for ds in numbered(30)[18:]:                         # 12 more while it pages
            server.put(ds)
        ids = first + [d["dataset_id"] for page in pages for d in page]
        assert ids == [f"ds-{i:05d}" for i in range(30)] and listing.complete   # each once
        assert [q["offset"] for q in server.catalog_requests()] == ["0", "5", "10", "15"]
        assert len(server.export_requests()) == 1
        within_the_documented_limits(server)


def test_a_short_page_alone_does_not_end_the_listing(portal):
    portal.page_cap = 3          # the portal answers 3 where 5 were asked, and its total_count says 5
    ids, listing = listed(source_for(portal), page_size=5)
    assert ids == sorted(fixture_ids()) and listing.complete
    assert [q["offset"] for q in portal.catalog_requests()] == ["0", "3"]


def test_a_short_page_without_a_total_is_followed_by_an_empty_one(portal):
    # a portal that gives no total_count: the listing ends on the empty page that follows, not before
    portal.page_cap, portal.no_total = 3, True
    source = source_for(portal)
    ids, listing = listed(source, page_size=5)
    assert ids == sorted(fixture_ids()) and listing.complete and source.total is None
    assert [q["offset"] for q in portal.catalog_requests()] == ["0", "3", "5"]


@pytest.mark.slow
def test_an_incremental_run_past_10000_changed_datasets_is_exported_with_its_filter():
    datasets = numbered(12_000)
    for ds in datasets[:10_500]:
        ds["metas"]["default"]["modified"] = "2024-06-01T00:00:00+00:00"
    with OpenDataSoftPortal(datasets) as server:
        source = source_for(server)
        since = datetime(2024, 5, 1, tzinfo=timezone.utc)
        ids, listing = listed(source, since=since)
        assert ids == [f"ds-{i:05d}" for i in range(10_500)] and source.total == 10_500
        assert not listing.complete                            # a filtered listing never removes anything
        [export] = server.export_requests()
        assert export["where"] == f"({modified_filter(since)})" == server.catalog_requests()[0]["where"]
        within_the_documented_limits(server)


def test_an_exported_listing_ignoring_the_filter_is_detected():
    datasets = numbered(30)
    for ds in datasets[:25]:                 # the last 5 are older than asked: only the export shows them
        ds["metas"]["default"]["modified"] = "2024-06-01T00:00:00+00:00"
    with OpenDataSoftPortal(datasets) as server:
        server.offset_cap = 20
        server.ignore_filter = True
        with pytest.raises(FilterRejected, match="ignored the modified-since filter .*'ds-00025' was modified"):
            listed(source_for(server, offset_cap=20), since=datetime(2024, 5, 1, tzinfo=timezone.utc))
        assert len(server.export_requests()) == 1


def test_an_identifier_listing_past_the_cap_exports_ids_and_modified_only():
    with OpenDataSoftPortal(numbered(12_000)) as server:
        source = source_for(server)
        pages = list(source.list_ids(100))
        ids = [i for page in pages for i, _ in page.ids]
        assert ids == [f"ds-{i:05d}" for i in range(12_000)] and not any(page.records for page in pages)
        assert {m for page in pages for _, m in page.ids} == {datetime(2024, 1, 1, tzinfo=timezone.utc)}
        [export] = server.export_requests()
        assert export["select"] == "dataset_id,modified" == server.catalog_requests()[0]["select"]
        within_the_documented_limits(server)


def test_an_export_cut_short_is_asked_again_and_each_dataset_listed_once(caplog):
    with OpenDataSoftPortal(numbered(30)) as server:
        server.offset_cap = 20
        source = source_for(server, offset_cap=20)
        listing = Listing()
        pages = source.iter_items(None, 5, listing)
        ids = [d["dataset_id"] for d in next(pages)]        # the first page, then the export ...
        server.truncate_next(1)                              # ... which stops after 15 of its 30
        ids += [d["dataset_id"] for page in pages for d in page]
        assert ids == [f"ds-{i:05d}" for i in range(30)] and listing.complete
        assert len(server.export_requests()) == 2
        # (the count it says is what was parsed when the connection broke: the parser reads ahead)
        assert re.search(r"exports/json: the export ended after \d+ datasets, before its end: the connection broke",
                         caplog.text)


def test_an_export_always_cut_short_fails_the_listing_never_complete():
    with OpenDataSoftPortal(numbered(30)) as server:
        server.offset_cap = 20
        server.cut_export_after = 12
        source = source_for(server, offset_cap=20, max_retries=2)
        listing = Listing()
        got = []
        with pytest.raises(RetriesExhausted, match=r"the export ended after \d+ datasets, before its end") as err:
            for page in source.iter_items(None, 5, listing):
                got += [d["dataset_id"] for d in page]
        assert not listing.complete and err.value.transient
        assert "asked 3 times, the listing is incomplete" in str(err.value) and server.base_url in str(err.value)
        assert 5 <= len(got) <= 12 and got == [f"ds-{i:05d}" for i in range(len(got))]
        assert len(server.export_requests()) == 3
        with pytest.raises(RetriesExhausted):                  # an identifier listing so cut fails too
            list(source_for(server, offset_cap=20, max_retries=0).list_ids(5))


def test_an_exported_dataset_100000_levels_deep_is_read_in_little_memory_and_fails_alone():
    """ijson's ``items`` gave every event its path as a string, which grows with the depth: one
    dataset 100,000 levels deep in the export (600 KB) made gigabytes of them. The export is read
    from the parser's basic events, the dataset built down to one level past the cap."""
    import tracemalloc

    from harvester.testing.local_http import nested

    datasets = numbered(30)
    datasets[25]["metas"]["default"]["tree"] = nested(100_000)
    with OpenDataSoftPortal(datasets) as server:
        server.offset_cap = 20
        source = source_for(server, offset_cap=20)
        tracemalloc.start()
        try:
            records, listing = harvest(source, page_size=5)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert server.export_requests() and listing.complete and peak < 30_000_000
    assert [r.source_id for r in records] == [f"ds-{i:05d}" for i in range(30)]
    assert [r.source_id for r in records if not r.ok] == ["ds-00025"]
    assert [(p.code, p.field) for p in by_id(records)["ds-00025"].problems] == [
        ("record-too-deep", "metas.default.tree" + ".in" * 61)]


def test_the_server_refuses_what_the_api_documents_it_refuses(portal):
    import requests

    # the documented 400 body: {"message", "error_code"} (portal-samples/opendatasoft/
    # explore-v2.1-error-400-odsql-openapi-example.json)
    for params, code, said in [({"limit": 101}, "InvalidRESTParameterError", "-1 <= limit <= 100"),
                               ({"limit": 100, "offset": 9_901}, "InvalidRESTParameterError", "<= 10000"),
                               ({"where": 'dataset_id > "ds-09999"'}, "ODSQLError",
                                "'dataset_id' can only be compared with '='"),
                               ({"where": 'title < "m"'}, "ODSQLError", "'title' can only be compared with '='")]:
        resp = requests.get(portal.base_url + CATALOG, params=params, timeout=10)
        assert resp.status_code == 400, params
        body = resp.json()
        assert set(body) == {"message", "error_code"} and body["error_code"] == code and said in body["message"]
    resp = requests.get(portal.base_url + CATALOG, params={"limit": 100, "offset": 9_900}, timeout=10)
    assert resp.status_code == 200
    resp = requests.get(portal.base_url + EXPORT, params={"where": 'dataset_id = "test-a"'}, timeout=10)
    assert resp.headers["Transfer-Encoding"] == "chunked" and [d["dataset_id"] for d in resp.json()] == ["test-a"]


def test_a_portal_repeating_its_first_page_is_cut_incomplete(portal, caplog):
    for ident in ("test-a", "test-b", "test-c"):
        portal.edit(ident, "2024-05-01T10:00:00+00:00")
    portal.loop = True
    source = source_for(portal)
    records, listing = harvest(source, since=datetime(2024, 1, 1, tzinfo=timezone.utc), page_size=2)
    assert [r.source_id for r in records] == ["test-a", "test-b"] and not listing.complete
    assert len(portal.catalog_requests()) == 2 and "repeats datasets already listed" in source.cut
    assert "incomplete" in caplog.text


def test_a_full_listing_cut_by_a_loop_is_incomplete(portal, caplog):
    # the pipeline removes nothing after a full listing that is not complete (steps.fetch_modified)
    portal.loop = True
    source = source_for(portal)
    records, listing = harvest(source, page_size=2)
    assert len(records) == 2 and not listing.complete
    assert "repeats datasets already listed" in source.cut and portal.base_url in caplog.text
    assert len(portal.catalog_requests()) == 2


def test_an_identifier_listing_cut_by_a_loop_fails_rather_than_pass_for_the_portal(portal):
    portal.loop = True
    source = source_for(portal)
    with pytest.raises(ListingCut, match="repeats datasets already listed") as err:
        list(source.list_ids(2))
    assert not err.value.transient and portal.base_url in str(err.value)


# -- incremental ------------------------------------------------------------------------------------
def test_incremental_asks_the_portal_for_what_changed(portal):
    portal.edit("test-c", "2024-05-01T10:00:00+00:00", title="test-c, edited")
    since = datetime(2024, 1, 1, tzinfo=timezone.utc)
    records, listing = harvest(source_for(portal), since=since)
    assert [r.source_id for r in records] == ["test-c"] and records[0].title == "test-c, edited"
    assert not listing.complete                      # a filtered listing never removes anything
    [asked] = portal.catalog_requests()
    assert asked["where"] == "(default.modified >= date'2024-01-01T00:00:00Z')" == f"({modified_filter(since)})"


def test_the_filter_is_written_to_the_second_and_the_check_agrees(portal):
    portal.edit("test-c", "2024-05-01T10:00:00+00:00")
    since = datetime(2024, 5, 1, 10, 0, 0, 700_000, tzinfo=timezone.utc)   # 0.7 s after the edit
    records, _ = harvest(source_for(portal), since=since)                     # not taken for an ignored filter
    assert [r.source_id for r in records] == ["test-c"]
    assert portal.catalog_requests()[0]["where"] == "(default.modified >= date'2024-05-01T10:00:00Z')"


def test_a_portal_ignoring_the_filter_is_detected(portal):
    portal.ignore_filter = True
    portal.edit("test-c", "2024-05-01T10:00:00+00:00")
    with pytest.raises(FilterRejected, match="ignored the modified-since filter"):
        harvest(source_for(portal), since=datetime(2024, 1, 1, tzinfo=timezone.utc))


# -- errors -----------------------------------------------------------------------------------------
def test_5xx_and_429_are_retried(portal):
    portal.fail_next(2, 503)
    portal.fail_next(1, 429, retry_after="0")
    source = source_for(portal)
    records, listing = harvest(source)
    assert len(records) == len(fixture_ids()) and listing.complete and source.requests_made == 4


def test_a_truncated_body_is_retried(portal):
    portal.truncate_next(1)
    source = source_for(portal)
    records, _ = harvest(source)
    assert len(records) == len(fixture_ids()) and source.requests_made == 2


def test_a_portal_down_outlives_the_retries(portal):
    portal.fail_next(10, 503)
    with pytest.raises(RetriesExhausted, match="HTTP 503"):
        harvest(source_for(portal, max_retries=2))
    assert len(portal.catalog_requests()) == 3


def test_404_is_terminal_and_names_portal_and_url(portal):
    fetcher = HttpFetcher(portal.base_url, sleep=lambda s: None)
    source = OpenDataSoftSource(portal.base_url + "/nothing-here", fetcher=fetcher)
    with pytest.raises(SourceError) as err:
        harvest(source)
    assert not err.value.transient and source.requests_made == 1
    assert f"{portal.base_url}/nothing-here/api/explore/v2.1/catalog/datasets" in str(err.value)
    assert "404" in str(err.value)


# -- reconciliation (sources/base.py list_ids / fetch_by_ids / count) --------------------------------
def test_list_ids_asks_for_ids_and_modified_only(portal):
    source = source_for(portal)
    pages = list(source.list_ids(2))
    ids = dict(i for page in pages for i in page.ids)
    assert set(ids) == fixture_ids() and not any(page.records for page in pages)
    assert ids[RTE_ID] == datetime(2016, 7, 4, 12, 28, 31, tzinfo=timezone.utc)
    records = by_id(harvest(source_for(portal))[0])
    assert all(ids[k] == records[k].metadata_modified for k in ids)        # what the pipeline compares
    assert {q["select"] for q in portal.catalog_requests()[:3]} == {"dataset_id,modified"}


def test_list_ids_uses_whole_datasets_a_portal_sends_anyway(portal):
    portal.ignore_select = True
    pages = list(source_for(portal).list_ids(100))
    assert {r.source_id for r in pages[0].records} == fixture_ids() and pages[0].ignored == "select=dataset_id,modified"
    assert {i for i, _ in pages[0].ids} == fixture_ids()


def test_fetch_by_ids_leaves_out_what_is_gone(portal):
    source = source_for(portal)
    pages = list(source.fetch_by_ids(["test-a", "test-d", "gone-since", 'quo"te'], per_request=2))
    assert [[r.source_id for r in page] for page in pages] == [["test-a", "test-d"], []]
    assert [q["where"] for q in portal.catalog_requests()] == ['dataset_id = "test-a" OR dataset_id = "test-d"',
                                                               'dataset_id = "gone-since" OR dataset_id = "quo\\"te"']


def test_fetch_by_ids_detects_an_ignored_condition(portal):
    portal.ignore_ids = True
    with pytest.raises(FilterRejected, match="ignored the condition on dataset_id"):
        list(source_for(portal).fetch_by_ids(["test-a"]))


def test_count_is_one_request_with_limit_0(portal):
    source = source_for(portal)
    assert source.count() == len(fixture_ids()) and source.requests_made == 1
    assert portal.catalog_requests()[0]["limit"] == "0"
