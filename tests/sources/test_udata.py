"""The udata source (harvester.sources.udata) on udata's real recorded answers
(../shared/portal-samples/udata) and against the local udata server (real HTTP): the mapping, the
scope of a portal url, the full listing and its proof, the incremental cut at the watermark, a
portal ignoring or refusing the sort, loops and next pages elsewhere, a catalogue changing while it
is read, faults retried, errors named, the id listing through X-Fields, count, fetch by id,
validation."""
from __future__ import annotations

import copy
import json
import logging
import math
from datetime import datetime, timedelta, timezone

import pytest

from harvester.http import HttpFetcher
from harvester.http.guard import TooLarge
from harvester.sources.base import FilterRejected, Listing, SourceError, SourceUnavailable
from harvester.sources.udata import (ID_MASK, InvalidPortalUrl, UdataSource, normalize, scope_of, to_package)
from harvester.testing.samples import portal_sample
from harvester.testing.udata_portal import UdataPortal, catalogue, object_id, organizations_of, sample_datasets

N = 250
NOW = datetime.now(timezone.utc)


def recorded(name: str) -> dict:
    return json.loads(portal_sample("udata", name).read_text(encoding="utf-8"))


def deces() -> dict:
    return recorded("dataset-fichier-des-personnes-decedees-www-2023-10.json")


def impulsyon() -> dict:
    return json.loads(recorded("dataset-impulsyon-harvested-next-and-www-2019-01-22.exvcr.json")[1]["response"]["body"])


@pytest.fixture
def datasets():
    return catalogue(N)


@pytest.fixture
def portal(datasets):
    with UdataPortal(datasets, organizations_of(datasets)) as server:
        yield server


def source(server, url: str | None = None, **kw) -> UdataSource:
    fetcher = HttpFetcher(server.url, max_retries=kw.pop("max_retries", 3), backoff=0.01, sleep=lambda s: None,
                          **kw)
    return UdataSource(url or server.url, fetcher=fetcher, portal="test")


def listed(src, since=None, page_size=100):
    listing = Listing()
    records = [r for page in src.iter_records(since, page_size, listing) for r in page]
    return records, listing


# -- mapping of the recorded answers ------------------------------------------------------------------
def test_the_recorded_dataset_with_129_resources_maps_to_a_package():
    ds = deces()
    assert len(ds["resources"]) == 129
    pkg = to_package(ds, "https://www.data.gouv.fr/api/1")
    assert pkg["id"] == "5de8f397634f4164071119c5" and pkg["name"] == "fichier-des-personnes-decedees"
    assert pkg["title"] == "Fichier des personnes décédées"
    assert pkg["notes"].startswith("**Les fichiers nominatifs")
    assert pkg["organization"]["title"] == "Institut National de la Statistique et des Etudes Economiques (Insee)"
    assert pkg["organization"]["name"] == "institut-national-de-la-statistique-et-des-etudes-economiques-insee"
    assert pkg["license_id"] == "lov2" and [t["name"] for t in pkg["tags"]] == ["deces", "etat-civil"]
    assert pkg["url"] == "https://www.data.gouv.fr/fr/datasets/fichier-des-personnes-decedees/"
    assert pkg["metadata_modified"] == "2023-10-12T15:05:34.765000+00:00"
    assert len(pkg["resources"]) == 129
    first = pkg["resources"][0]
    assert first["url"].endswith("/deces-2023-t3.txt") and first["name"] == "deces-2023-t3.txt"
    assert (first["format"], first["mimetype"], first["size"]) == ("txt", "text/plain", 29739956)
    assert first["hash"] == "sha1:d0e6d9499e556c4269b15a92f9288726e90c10ea"
    assert first["last_modified"] == "2023-10-11T07:21:01.316000+00:00" and first["resource_type"] == "main"
    last = pkg["resources"][-1]
    assert "extras" not in last or not any(k.startswith(("check:", "analysis:")) for k in last["extras"])
    extras = {e["key"]: e["value"] for e in pkg["extras"]}
    assert extras["frequency"] == "monthly" and extras["acronym"] == "Décès"
    assert json.loads(extras["temporal_coverage"]) == {"end": "2022-12-31", "start": "1970-01-01"}
    assert json.loads(extras["spatial"])["zones"] == ["country:fr"]
    for volatile in ("metrics", "quality", "internal", "last_update", "frequency_date", "recommendations",
                     "recommendations:sources"):
        assert volatile not in extras
    record = normalize(ds, "https://www.data.gouv.fr/api/1")
    assert record.ok and record.source_id == "5de8f397634f4164071119c5"
    assert record.metadata_modified == datetime(2023, 10, 12, 15, 5, 34, 765000, tzinfo=timezone.utc)
    assert record.language is None  # the portal's language: data.gouv.fr's datasets declare none


def test_the_harvested_dataset_of_2019_dates_without_zone_are_utc():
    ds = impulsyon()
    record = normalize(ds, "https://www.data.gouv.fr/api/1")
    assert record.ok and record.metadata_modified == datetime(2018, 11, 23, 5, 43, 20, 798000, tzinfo=timezone.utc)
    extras = {e["key"]: e["value"] for e in record.raw["extras"]}
    assert extras["harvest:domain"] == "data.loire-atlantique.fr" and "ods:url" in extras
    assert "harvest:last_update" not in extras   # the time data.gouv.fr harvested it, not a change
    assert [r["format"] for r in record.raw["resources"]][:1] == ["csv"]
    assert record.organization == "Département de Loire-Atlantique"


def test_what_changes_without_the_dataset_changing_leaves_the_metadata_hash_alone():
    ds = impulsyon()
    base = normalize(ds, "https://x/api/1")
    churn = copy.deepcopy(ds)
    churn["metrics"]["views"] += 100
    churn["resources"][0]["extras"]["check:date"] = "2030-01-01T00:00:00"
    churn["extras"]["harvest:last_update"] = "2030-01-01T00:00:00"
    churn["last_update"] = "2030-01-01T00:00:00"
    assert normalize(churn, "https://x/api/1").metadata_hash == base.metadata_hash
    edited = copy.deepcopy(ds)
    edited["tags"].append("bus")
    assert normalize(edited, "https://x/api/1").metadata_hash != base.metadata_hash
    edited = copy.deepcopy(ds)
    edited["frequency"] = "daily"
    assert normalize(edited, "https://x/api/1").metadata_hash != base.metadata_hash


@pytest.mark.parametrize("change, code", [
    ({"id": None}, "no-identifier"), ({"id": "  "}, "no-identifier"), ({"title": ""}, "no-title"),
    ({"last_modified": "yesterday"}, "bad-date"), ({"description": {"fr": "x"}}, "wrong-type"),
])
def test_a_record_it_cannot_use_is_that_records_coded_failure(change, code):
    ds = dict(impulsyon(), **change)
    record = normalize(ds, "https://x/api/1")
    assert not record.ok and [p.code for p in record.problems if p.severity == "error"] == [code], record.problems
    assert not normalize(["not", "a", "dataset"], "https://x/api/1").ok


# -- the scope of a portal url ------------------------------------------------------------------------
@pytest.mark.parametrize("url, expected", [
    ("https://www.data.gouv.fr", ("https://www.data.gouv.fr/api/1", None)),
    ("https://www.data.gouv.fr/fr/", ("https://www.data.gouv.fr/api/1", None)),
    ("https://www.data.gouv.fr/api/1/datasets/", ("https://www.data.gouv.fr/api/1", None)),
    ("https://www.data.gouv.fr/fr/organizations/insee/", ("https://www.data.gouv.fr/api/1", "insee")),
    ("https://www.data.gouv.fr/organizations/534fff81a3a7292c64a77e5c/",
     ("https://www.data.gouv.fr/api/1", "534fff81a3a7292c64a77e5c")),
    ("https://data.public.lu/api/1/datasets/?organization=534fff81a3a7292c64a77e5c",
     ("https://data.public.lu/api/1", "534fff81a3a7292c64a77e5c")),
    ("https://data.public.lu/api/1/organizations/acme/", ("https://data.public.lu/api/1", "acme")),
])
def test_the_portal_url_names_a_site_or_an_organisation(url, expected):
    assert scope_of(url)[:2] == expected and scope_of(url)[2] is False


def test_a_url_that_names_no_scope_is_refused_naming_it():
    with pytest.raises(InvalidPortalUrl) as raised:
        UdataSource("https://www.data.gouv.fr/fr/datasets/foo/", fetcher=None)
    assert str(raised.value).startswith("https://www.data.gouv.fr/fr/datasets/foo/ is not a udata portal's url: "
                                        "give the site (https://www.data.gouv.fr), an organisation's page")


# -- listings ------------------------------------------------------------------------------------------
def test_a_full_listing_follows_next_page_to_its_end_and_is_complete(portal, datasets):
    src = source(portal)
    records, listing = listed(src)
    assert listing.complete and src.total == N
    assert [r.source_id for r in records] == [d["id"] for d in datasets]   # creation order
    assert all(r.ok for r in records)
    paths = portal.list_requests()
    assert len(paths) == math.ceil(N / 100) and "sort=created" in paths[0] and "page_size=100" in paths[0]
    assert "page=3" in paths[-1]


def test_a_page_size_above_the_polite_cap_is_capped(portal):
    src = source(portal)
    listed(src, page_size=5000)
    assert "page_size=100" in portal.list_requests()[0]


def test_an_incremental_reads_newest_first_and_stops_at_the_watermark(portal, datasets):
    src = source(portal)
    portal.edit(datasets[5]["id"], NOW, data=True, title="new file")
    portal.edit(datasets[6]["id"], NOW, title="metadata only")        # last_update unchanged
    records, listing = listed(src, since=NOW - timedelta(hours=1))
    assert [r.title for r in records] == ["new file"]
    assert listing.reached_since and not listing.complete
    assert len(portal.list_requests()) == 1 and "sort=-last_update" in portal.list_requests()[0]


def test_an_older_udata_sorting_by_the_internal_date_is_followed(portal, datasets):
    portal.sort_field = "internal.last_modified_internal"   # before udata #3377 (2025-07)
    src = source(portal)
    portal.edit(datasets[5]["id"], NOW, title="metadata only")
    portal.edit(datasets[9]["id"], NOW - timedelta(minutes=5), title="earlier edit")
    records, listing = listed(src, since=NOW - timedelta(hours=1))
    assert [r.title for r in records] == ["metadata only", "earlier edit"] and listing.reached_since


def test_while_both_dates_are_in_order_the_later_one_decides_where_to_stop(portal, datasets):
    portal.sort_field = "internal.last_modified_internal"
    portal.edit(datasets[5]["id"], NOW, title="metadata only")   # its last_update is of 2024
    records, listing = listed(source(portal), since=NOW - timedelta(hours=1), page_size=1)
    assert [r.title for r in records] == ["metadata only"] and listing.reached_since
    assert len(portal.list_requests()) == 2


def test_a_portal_ignoring_the_sort_is_detected(portal, datasets):
    portal.ignore_sort = True
    portal.edit(datasets[100]["id"], NOW, data=True)
    with pytest.raises(FilterRejected, match="ignored sort=-last_update"):
        listed(source(portal), since=NOW - timedelta(hours=1))


def test_a_portal_refusing_the_sort_is_a_filter_rejected(portal):
    del portal.sorts["last_update"]
    with pytest.raises(FilterRejected) as raised:
        listed(source(portal), since=NOW - timedelta(hours=1))
    assert "refused sort=-last_update (HTTP 400: Input payload validation failed; sort: " in str(raised.value)


def test_a_next_page_loop_is_cut_not_complete_and_refused_for_reconciliation(portal, caplog):
    portal.loop_after = 2
    caplog.set_level(logging.WARNING, logger="harvester")
    records, listing = listed(source(portal))
    assert len(records) == 200 and not listing.complete
    assert "asks page '1' after page 2" in caplog.text
    with pytest.raises(SourceError, match="could not be read whole"):
        [p for p in source(portal).list_ids(100)]


def test_a_next_page_on_another_host_is_not_followed(portal, caplog):
    portal.next_host = "evil.example:9"
    caplog.set_level(logging.WARNING, logger="harvester")
    records, listing = listed(source(portal))
    assert len(records) == 100 and not listing.complete
    assert "it is on another host (evil.example)" in caplog.text
    assert len(portal.requests) == 1


def test_an_http_next_page_of_an_https_portal_is_asked_on_the_portals_origin(portal):
    src = source(portal)
    link = portal.url.replace("http://", "https://") + "/api/1/datasets/?sort=created&page=2&page_size=100"
    assert src._next_url(link, 1, {"sort": "created"}) == portal.url + "/api/1/datasets/?sort=created&page=2&page_size=100"


def test_a_server_serving_fewer_than_page_size_skips_and_the_counts_tell(portal, caplog):
    portal.max_page_size = 60   # pages of 60 at offsets of 100: 40 of every 100 never served
    caplog.set_level(logging.WARNING, logger="harvester")
    records, listing = listed(source(portal))
    assert len(records) == 60 + 60 + 50 and not listing.complete
    assert "170 distinct datasets listed where total says 250" in caplog.text


def test_a_next_page_dropping_the_page_size_is_not_followed(portal):
    src = source(portal)
    link = portal.url + "/api/1/datasets/?sort=created&page=2"
    assert src._next_url(link, 1, {"sort": "created", "page": 1, "page_size": 100}) is None


def test_a_deletion_while_the_pages_are_read_makes_the_listing_incomplete(portal, datasets, caplog):
    caplog.set_level(logging.WARNING, logger="harvester")
    src = source(portal)
    listing = Listing()
    pages = src.iter_records(None, 100, listing)
    first = next(pages)
    portal.delete(datasets[3]["id"])          # already read: the rest moves up one place, one is skipped
    rest = [r for page in pages for r in page]
    assert len(first) + len(rest) == N - 1 and not listing.complete
    assert "total went from 250 to 249" in caplog.text
    ids = src.list_ids(100)
    next(ids)
    portal.delete(datasets[4]["id"])
    with pytest.raises(SourceUnavailable, match="could not be read whole"):  # transient: try again
        list(ids)


def test_a_creation_while_the_pages_are_read_does_not_spoil_the_listing(portal, datasets):
    src = source(portal)
    listing = Listing()
    pages = src.iter_records(None, 100, listing)
    first = next(pages)
    new = copy.deepcopy(datasets[0])
    new.update(id=object_id(999_999), title="created meanwhile", slug="created-meanwhile",
               internal={"created_at_internal": "2099-01-01T00:00:00+00:00"})
    portal.put(new)
    rest = [r for page in pages for r in page]
    assert len(first) + len(rest) == N + 1 and listing.complete


def test_deleted_private_and_archived_datasets_are_left_out(portal, datasets):
    portal.show_hidden = True   # what an administrator's API key is shown
    portal.datasets[datasets[1]["id"]]["deleted"] = "2024-05-01T00:00:00+00:00"
    portal.datasets[datasets[2]["id"]]["private"] = True
    portal.datasets[datasets[3]["id"]]["archived"] = "2024-05-01T00:00:00+00:00"
    records, listing = listed(source(portal))
    assert len(records) == N - 3 and listing.complete
    assert not {d["id"] for d in datasets[1:4]} & {r.source_id for r in records}
    ids = {i for page in source(portal).list_ids(1000) for i, _ in page.ids}
    assert len(ids) == N - 3


def test_an_organisation_by_slug_is_resolved_once_and_filters_the_listing(portal, datasets):
    src = source(portal, url=portal.url + "/fr/organizations/angers-loire-metropole/")
    records, listing = listed(src)
    angers = [d["id"] for d in datasets if d["organization"]["slug"] == "angers-loire-metropole"]
    assert [r.source_id for r in records] == angers and listing.complete
    assert portal.requests[0] == "/api/1/organizations/angers-loire-metropole/"
    assert all("organization=538346d6a3a72906c7ec5c36" in p for p in portal.list_requests())
    assert src.count() == len(angers)
    missing = source(portal, url=portal.url + "/fr/organizations/nobody/")
    with pytest.raises(SourceError, match="HTTP 404"):
        listed(missing)


# -- faults and errors ---------------------------------------------------------------------------------
def test_transient_faults_are_retried(portal):
    portal.fail_next(1, status=503)
    portal.fail_next(1, status=429, retry_after="0")
    portal.fail_next(1, truncate=True)
    src = source(portal)
    records, listing = listed(src)
    assert len(records) == N and listing.complete
    assert src.requests_made == math.ceil(N / 100) + 3


def test_a_404_is_terminal_at_once_naming_the_url_and_udatas_message(portal):
    src = source(portal, url=portal.url + "/sub/api/1/")
    with pytest.raises(SourceError) as raised:
        listed(src)
    assert f"portal test: GET {portal.url}/sub/api/1/datasets/?sort=created&page=1&page_size=100: HTTP 404 (The " \
           "requested URL was not found on the server." in str(raised.value)
    assert len(portal.requests) == 1


def test_a_body_that_never_ends_stops_at_the_size_cap(portal, monkeypatch):
    monkeypatch.setenv("HARVESTER_FETCH_MAX_BYTES", "1MB")
    portal.endless_page = 2
    with pytest.raises(TooLarge, match="larger than 1MB"):
        listed(source(portal, max_retries=0))


# -- reconciliation -----------------------------------------------------------------------------------
def test_the_id_listing_asks_for_ids_alone_with_x_fields(portal, datasets):
    src = source(portal)
    pages = list(src.list_ids(1000))
    assert [i for page in pages for i, _ in page.ids] == [d["id"] for d in datasets]
    assert all(not page.records for page in pages)
    assert pages[0].ids[0][1] == datetime(2024, 1, 1, tzinfo=timezone.utc)
    assert portal.headers_seen[-1]["x-fields"] == ID_MASK and "page_size=1000" in portal.requests[-1]


def test_a_server_ignoring_x_fields_sends_whole_records_that_are_used(portal):
    portal.ignore_mask = True
    pages = list(source(portal).list_ids(1000))
    assert len(pages[0].records) == N and pages[0].ignored == "the X-Fields mask"


def test_count_is_one_request_of_one_dataset(portal):
    src = source(portal)
    assert src.count() == N
    assert portal.requests == ["/api/1/datasets/?page=1&page_size=1"]
    assert portal.headers_seen[-1]["x-fields"] == "total"


def test_fetch_by_ids_leaves_out_what_is_gone(portal, datasets):
    portal.delete(datasets[1]["id"])
    portal.datasets[datasets[2]["id"]]["private"] = True
    src = source(portal)
    pages = list(src.fetch_by_ids([datasets[0]["id"], datasets[1]["id"], datasets[2]["id"], "nope",
                                   datasets[3]["id"]], per_request=2))
    assert [[r.source_id for r in page] for page in pages] == [[datasets[0]["id"], datasets[3]["id"]]]


def test_the_api_key_goes_in_x_api_key(portal):
    src = source(portal, header_auth=("X-API-KEY", "s3cret"))
    src.count()
    assert portal.headers_seen[-1]["x-api-key"] == "s3cret"


# -- validation ---------------------------------------------------------------------------------------
def test_harvester_validate_reads_the_first_pages_of_a_portal(portal):
    from harvester.pipeline.validate import validate_url

    report = validate_url(portal.url, "udata", pages=2, page_size=100)
    assert report.as_dict()["records"] == 200 and report.as_dict()["complete"] is False  # (2 of 3 pages)


def test_harvester_validate_reads_a_saved_page(tmp_path):
    from harvester.pipeline.validate import validate_path

    page = {"data": sample_datasets()[:3] + [{"title": "no id"}], "page": 1, "page_size": 20, "total": 4,
            "next_page": None, "previous_page": None}
    path = tmp_path / "page.json"
    path.write_text(json.dumps(page))
    report = validate_path(path, "udata").as_dict()
    assert report["records"] == 4 and report["failed"] == 1 and report["complete"] is True
