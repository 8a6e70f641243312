"""The ISO WAF source (harvester.sources.iso_waf) on the recorded listings and records of
../shared/portal-samples/iso-waf/ and over real HTTP to the local WAF (testing/iso_waf_portal.py):
the four date formats, the walk of nested folders in every style, the CSW source's ISO mapping
keyed by file URL, declared encodings, incremental and conditional fetches (requests counted),
incomplete walks that remove nothing, loops, hostile files, resuming, reconciliation, validate."""
from __future__ import annotations

import io
import logging
from datetime import datetime, timedelta, timezone

import pytest

from harvester.http import HttpFetcher, RetriesExhausted
from harvester.sources.base import Listing, SourceError
from harvester.sources.iso_waf import (TIME_ZONE_MARGIN, IsoWafSource, WafFile as Listed, date_after, date_before,
                                       declared_language, parse_listing, read_iso, waf_record)
from harvester.testing.hostile_documents import nested_entities_rdfxml
from harvester.testing.iso_waf_portal import (RECORDS, STYLES, WafFile, WafServer, catalogue, derive, real_record)
from harvester.testing.samples import portal_sample

SAMPLES = {  # recorded listing -> the URL it was captured at (or, hand-made, one like it)
    "waf-listing-apache-noaa-garfo-2026-08-19.html": "https://data.noaa.gov/waf/NOAA/nmfs/garfo/iso/xml/",
    "waf-listing-nginx-alaska-dggs-2026-08-19.html": "https://dggs.alaska.gov/webpubs/metadata/",
    "waf-listing-iis-epa-edg-2026-08-19.html": "https://edg.epa.gov/WAFer_harvest/ISO/",
    "waf-listing-iis-longdate-bts-2026-08-19.html": "https://transtats.bts.gov/NTADmetadata/",
    "waf-listing-apache-census-nodates-edited.html": "https://www2.census.gov/geo/necta_500k/",
    "waf-listing-apache-with-subfolder-handmade-ckanext-spatial.html": "http://localhost/apache-folder/",
    "waf-listing-nginx-with-subfolder-handmade-ckanext-spatial.html": "http://localhost/nginx/",
}


def sample_listing(name: str):
    url = SAMPLES[name]
    return parse_listing(portal_sample("iso-waf", name).read_text(), url, url)


def source(server, url=None, **kw) -> IsoWafSource:
    fetcher = HttpFetcher(server.url, max_retries=kw.pop("max_retries", 2), backoff=0.01, sleep=lambda s: None)
    return IsoWafSource(url or server.url, fetcher=fetcher, portal=kw.pop("portal", "waf"), **kw)


def listed(src, since=None, validators=None, listing=None):
    listing = listing or Listing()
    records = [r for page in src.iter_records(since, 1000, listing, validators) for r in page]
    return records, listing


@pytest.fixture
def waf():
    with WafServer() as server:
        yield server


# -- the recorded listings ------------------------------------------------------------------------
def test_the_recorded_listings_give_their_files_and_dates():
    got = {name: [(f.url.rsplit("/", 1)[-1], f.modified) for f in sample_listing(name).files] for name in SAMPLES}
    assert got == {
        "waf-listing-apache-noaa-garfo-2026-08-19.html": [("1463.xml", datetime(2026, 7, 12, 2, 23)),
                                                          ("1503.xml", datetime(2026, 7, 12, 2, 23))],
        # the sibling .faq.html and .txt files are not records
        "waf-listing-nginx-alaska-dggs-2026-08-19.html": [("AOF125.xml", datetime(2025, 10, 2, 11, 47)),
                                                          ("AOF134.xml", datetime(2026, 7, 30, 16, 1))],
        "waf-listing-iis-epa-edg-2026-08-19.html": [
            ("enviroatlas-metadata-waf_ACS_Demographics_by_Tract_2008_2012_EA.xml", datetime(2021, 6, 17, 12, 20)),
            ("enviroatlas-metadata-waf_Ag_On_Slopes.xml", datetime(2025, 7, 23, 17, 33))],
        "waf-listing-iis-longdate-bts-2026-08-19.html": [
            ("USDOT_BTS_NTAD_119th_Congressional_Districts.xml", datetime(2026, 7, 31, 16, 53)),
            ("USDOT_BTS_NTAD_1991_FAP.xml", datetime(2026, 7, 15, 16, 23))],
        "waf-listing-apache-census-nodates-edited.html": [("cb_2014_us_necta_500k.shp.iso.xml", None)],
        "waf-listing-apache-with-subfolder-handmade-ckanext-spatial.html": [("record-1.xml",
                                                                             datetime(2024, 11, 7, 15, 0))],
        "waf-listing-nginx-with-subfolder-handmade-ckanext-spatial.html": [("record-1.xml",
                                                                            datetime(2024, 11, 7, 15, 0))],
    }
    # IIS's absolute hrefs resolve to the folder's files; its parent link is not a sub-folder
    iis = sample_listing("waf-listing-iis-epa-edg-2026-08-19.html")
    assert iis.files[0].url.startswith("https://edg.epa.gov/WAFer_harvest/ISO/") and iis.folders == []
    assert sample_listing("waf-listing-apache-with-subfolder-handmade-ckanext-spatial.html").folders == [
        "http://localhost/apache-folder/subfolder/"]
    assert sample_listing("waf-listing-nginx-with-subfolder-handmade-ckanext-spatial.html").folders == [
        "http://localhost/nginx/subfolder/"]
    assert all(sample_listing(name).recognized for name in SAMPLES)


def test_dates_in_every_format_and_impossible_ones():
    assert date_after("  2026-07-12 02:23  35K") == (datetime(2026, 7, 12, 2, 23), "2026-07-12 02:23")
    assert date_after("   02-Oct-2025 11:47     45K")[0] == datetime(2025, 10, 2, 11, 47)
    assert date_before(" 6/17/2021 12:20 AM        39985 ")[0] == datetime(2021, 6, 17, 0, 20)
    assert date_before("  Friday, July 31, 2026 12:53 PM   27383")[0] == datetime(2026, 7, 31, 12, 53)
    assert date_before(" 13/45/2021 12:20 PM 1")[0] is None  # not a date: the file is undated, not refused
    assert date_after(" 2026-02-30 10:00 ")[0] is None and date_after(" 31-Foo-2025 11:47")[0] is None


def test_a_listing_keeps_only_files_and_folders_under_the_waf():
    html = ('<html><head><title>Index of /waf/a/</title></head><body><pre>'
            '<a href="../">../</a> <a href="/">/</a> <a href="/waf/">up</a> <a href="http://elsewhere.org/x.xml">x</a>'
            '<a href="/other/y.xml">y</a> <a href="dcatus/">dcatus/</a> <a href="b/">b/</a> <a href="./">.</a>'
            '<a href="c.XML#top">c</a> <a href="?C=M;O=A">sort</a> <a href="d.xml.txt">d</a></pre></body></html>')
    page = parse_listing(html, "http://h/waf/a/", "http://h/waf/")
    assert [f.url for f in page.files] == ["http://h/waf/a/c.XML"]
    assert page.folders == ["http://h/waf/a/b/"]


# -- the recorded records --------------------------------------------------------------------------
def test_the_recorded_records_map_through_the_csw_mapping_keyed_by_file_url():
    when = datetime(2026, 7, 12, 2, 23)
    records = {name: waf_record(read_iso(real_record(name)), Listed(f"http://h/waf/{name}", when)) for name in RECORDS}
    assert all(r.ok for r in records.values()), [r.error for r in records.values()]
    epa = records["iso19139-epa-enviroatlas-acs-demographics-2021-06-17.xml"]
    assert epa.source_id == epa.url == "http://h/waf/iso19139-epa-enviroatlas-acs-demographics-2021-06-17.xml"
    assert epa.raw["file_identifier"] == "{4c6928d8-6ac2-4909-8b3d-a29e2805ce2d}"  # braces and all, kept
    assert epa.raw["date_stamp"] == "2021-06-17" and epa.raw["schema"] == "iso19139"
    assert epa.metadata_modified == datetime(2026, 7, 12, 2, 23, tzinfo=timezone.utc)  # the listing's date
    assert epa.title.startswith("Demographics for US Census Tracts - 2012") and len(epa.tags) == 56
    assert epa.organization.startswith("U.S. Environmental Protection Agency")
    noaa = records["iso19115-2-noaa-inport-47598-2024-02-29.xml"]
    assert noaa.raw["schema"] == "iso19115-2" and noaa.raw["file_identifier"] == "gov.noaa.nmfs.inport:47598"
    assert noaa.raw["date_stamp"] == "2024-02-29T00:00:00" and noaa.organization == "Office for Coastal Management"
    census = records["iso19115-2-census-cb_2014_us_necta_500k.xml"]
    assert census.raw["date_stamp"] == "2015-05"
    assert census.raw["file_identifier"] == "cb_2014_us_necta_500k.shp.iso.xml"
    many = records["iso19115-2-noaa-psl-20crv3-many-keywords.xml"]
    text = real_record("iso19115-2-noaa-psl-20crv3-many-keywords.xml").decode()
    assert text.count("<gmd:keyword>") == 1259 and len(many.tags) > 1000
    assert {r.language for r in records.values()} == {"en"}  # gmd:language eng / eng; USA


def test_a_declared_iso_8859_1_encoding_is_read():
    county = real_record("iso19115-2-census-tl_2013_us_county-iso8859-1.xml")
    body = derive(county, title="Comté de Montréal, Québec")
    assert body.startswith(b'<?xml version="1.0" encoding="ISO-8859-1"?>') and "é".encode("latin-1") in body
    record = waf_record(read_iso(body), Listed("http://h/waf/x.xml"))
    assert record.title == "Comté de Montréal, Québec" and record.metadata_modified is None
    # no declaration, not UTF-8: the Content-Type's charset, else ISO-8859-1
    bare = body.split(b"?>", 1)[1]
    assert waf_record(read_iso(bare, "application/xml; charset=ISO-8859-1"), Listed("u")).title.startswith("Comté")
    assert waf_record(read_iso(bare), Listed("u")).title.startswith("Comté")


def test_declared_languages_as_iso_639_1():
    assert [declared_language(c) for c in ("eng", "fre", "fra", "ger; DEU", "en", "English", "zzz", "", None)] == \
        ["en", "fr", "fr", "de", "en", "english", None, None, None]


@pytest.mark.parametrize("body, code", [
    (nested_entities_rdfxml(), "unsafe-xml"),
    (b'<?xml version="1.0"?><!DOCTYPE x SYSTEM "http://evil/x.dtd"><gmd:MD_Metadata xmlns:gmd="http://www.isotc211.org'
     b'/2005/gmd"/>', "unsafe-xml"),
    (b"<html><body>Not here</body></html", "not-iso-metadata"),
    (b"%PDF-1.4 \x00\x01binary", "not-iso-metadata"),
    (b'<rdf:RDF xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#"/>', "not-iso-metadata"),
    (b'<gmd:MD_Metadata xmlns:gmd="http://www.isotc211.org/2005/gmd">' + b"<a>" * 200 + b"</a>" * 200
     + b"</gmd:MD_Metadata>", "unsafe-xml"),
])
def test_hostile_or_foreign_files_are_refused_with_their_code(body, code):
    from harvester.sources.iso_waf import Refused

    with pytest.raises(Refused) as refused:
        read_iso(body)
    assert refused.value.code == code


# -- walking a WAF over HTTP -------------------------------------------------------------------------
def test_a_nested_waf_in_every_listing_style_is_walked_whole(waf):
    files = catalogue(60, per_folder=5)
    waf.set_files(files)
    folders = {p.rsplit("/", 1)[0] + "/" for p in files}
    assert {waf._style(f) for f in folders | {""}} == set(STYLES)  # each style serves some folder
    src = source(waf)
    records, listing = listed(src)
    assert listing.complete and src.complete
    assert {r.source_id for r in records} == {waf.url + p for p in files}
    assert all(r.ok for r in records)
    undated = {f for f in folders if waf._style(f) == "apache-nodates"}
    for r in records:
        path = r.source_id[len(waf.url):]
        expected = None if path.rsplit("/", 1)[0] + "/" in undated else files[path].modified
        assert r.metadata_modified == (expected.replace(tzinfo=timezone.utc) if expected else None), path
    titles = {r.source_id[len(waf.url):]: r.title for r in records}
    assert titles["g1/s0/record-000005.xml"] == "Record 5"
    assert len(waf.file_requests()) == 60 and src.requests_made == 60 + len(waf.listing_requests())
    # the undated files' validators are kept for the next run
    assert set(listing.validators["files"]) == {r.source_id for r in records if r.metadata_modified is None}


def test_an_incremental_fetches_only_files_listed_since_minus_the_zone_margin(waf):
    now = datetime(2026, 8, 1, 12, 0)
    files = {f"a/f{i}.xml": WafFile(derive(real_record(RECORDS[i % 5]), title=f"T{i}"), now - timedelta(hours=i * 5))
             for i in range(8)}
    waf.set_files(files)
    waf.styles = {"": "nginx", "a/": "apache"}
    since = datetime(2026, 8, 1, 12, 0, tzinfo=timezone.utc) - timedelta(hours=2)
    records, listing = listed(source(waf), since=since)
    # listed within since - 14 h: 12:00, 07:00, 02:00, 21:00 the day before (f0..f3), not f4 (16 h before 2 h ago)
    assert sorted(r.source_id.rsplit("/", 1)[-1] for r in records) == ["f0.xml", "f1.xml", "f2.xml", "f3.xml"]
    assert len(waf.file_requests()) == 4 and not listing.complete
    assert TIME_ZONE_MARGIN == timedelta(hours=14)


def test_undated_files_are_asked_conditionally_and_cost_a_304(waf):
    files = {f"u/f{i}.xml": WafFile(derive(real_record(RECORDS[i % 5]), title=f"U{i}"), datetime(2025, 1, 1))
             for i in range(5)}
    waf.set_files(files)
    waf.styles = {"": "apache-nodates", "u/": "apache-nodates"}
    _, first = listed(source(waf))
    assert len(first.validators["files"]) == 5
    files["u/f2.xml"] = WafFile(derive(real_record(RECORDS[2]), title="U2 edited"), datetime(2025, 1, 1))
    waf.set_files(files)
    waf.requests.clear()
    src = source(waf)
    records, second = listed(src, since=datetime.now(timezone.utc), validators=first.validators)
    assert [r.title for r in records] == ["U2 edited"]
    assert sorted(status for _, _, status in waf.file_requests()) == [200, 304, 304, 304, 304]
    assert all("if-none-match" in headers for _, headers, _ in waf.file_requests())
    assert src.not_modified == 4 and set(second.validators["files"]) == set(first.validators["files"])
    assert second.validators["files"][waf.url + "u/f2.xml"] != first.validators["files"][waf.url + "u/f2.xml"]


def test_a_refused_sub_listing_leaves_the_walk_incomplete_and_ids_refused(waf, caplog):
    waf.set_files(catalogue(20, per_folder=5))
    waf.forbidden = {"g1/"}
    caplog.set_level(logging.WARNING, logger="harvester")
    src = source(waf)
    records, listing = listed(src)
    assert len(records) == 15 and not listing.complete  # g1's five files unseen: nothing may be removed
    assert "HTTP 403; the walk is incomplete" in caplog.text
    with pytest.raises(SourceError, match="the walk of the folders was incomplete"):
        list(src.list_ids(100))


def test_an_error_page_where_a_listing_should_be_is_retried_then_fails(waf):
    waf.set_files(catalogue(10, per_folder=5))
    waf.error_pages = {"g1/"}
    with pytest.raises(RetriesExhausted, match="not a directory listing"):
        listed(source(waf, max_retries=1))


def test_a_folder_looping_back_is_not_followed(waf, caplog):
    waf.set_files(catalogue(10, per_folder=5))
    waf.aliases = {"g0/s0/loop/": "g0/s0/", "g1/s0/up/": "g1/"}
    caplog.set_level(logging.WARNING, logger="harvester")
    src = source(waf)
    records, listing = listed(src)
    assert len(records) == 10 and listing.complete
    assert caplog.text.count("repeats the listing of a folder above it") == 2
    assert not any("/loop/loop/" in path for path, _, _ in waf.requests)


def test_the_walk_is_bounded_and_a_cut_walk_is_incomplete(waf, caplog):
    waf.set_files(catalogue(10, per_folder=5))
    caplog.set_level(logging.WARNING, logger="harvester")
    _, shallow = listed(source(waf, max_depth=1))
    assert not shallow.complete and "folders deep; not walked" in caplog.text
    _, few = listed(source(waf, max_folders=2))
    assert not few.complete and "more than 2 folders" in caplog.text


def test_hostile_files_are_their_records_outcome_and_the_rest_goes_on(waf):
    files = catalogue(4, per_folder=10)
    folder = "g0/s0/"
    files[folder + "bomb.xml"] = WafFile(nested_entities_rdfxml(), datetime(2025, 1, 1))
    files[folder + "page.xml"] = WafFile(b"<html><body>moved</body></html>", datetime(2025, 1, 1))
    files[folder + "endless.xml"] = WafFile(b"", datetime(2025, 1, 1))
    waf.set_files(files)
    waf.endless = {folder + "endless.xml"}
    src = source(waf, max_file_bytes=1_000_000)
    records, listing = listed(src)
    codes = {r.source_id.rsplit("/", 1)[-1]: (r.problems[0].code if r.problems and not r.ok else "ok")
             for r in records}
    assert codes == {"bomb.xml": "unsafe-xml", "page.xml": "not-iso-metadata", "endless.xml": "file-too-large",
                     **{f"record-{i:06d}.xml": "ok" for i in range(4)}}
    assert listing.complete
    assert src.bytes_received < 3_000_000  # the endless body read to the cap, not on


def test_a_file_that_drips_past_its_deadline_is_refused(waf):
    waf.set_files({"g0/s0/slow.xml": WafFile(b"", datetime(2025, 1, 1))})
    waf.endless = {"g0/s0/slow.xml"}
    records, _ = listed(source(waf, file_deadline=0.0))
    slow = [r for r in records if r.source_id.endswith("slow.xml")][0]
    assert slow.problems[0].code == "file-too-large" and "still arriving" in slow.error


def test_a_missing_waf_fails_naming_the_portal(waf):
    with pytest.raises(SourceError, match=r"portal waf .*HTTP 404"):
        listed(source(waf, url=waf.base_url + "/nowhere/"))


def test_a_resumed_listing_skips_what_was_staged(waf):
    files = catalogue(12, per_folder=4)
    waf.set_files(files)
    staged = {waf.url + p for p in sorted(files)[:5]}
    src = source(waf)
    records, listing = listed(src, listing=Listing(already_staged=frozenset(staged)))
    assert {r.source_id for r in records} == {waf.url + p for p in files} - staged
    assert len(waf.file_requests()) == 7 and listing.complete and src.skipped == 5


def test_a_file_failing_hands_over_what_was_fetched_before_the_error(waf):
    waf.set_files(catalogue(8, per_folder=8))
    waf.fail_files(after=3, times=100)
    pages, src = [], source(waf, max_retries=0)
    with pytest.raises(RetriesExhausted):
        for page in src.iter_records(None, 1000, Listing()):
            pages.append(page)
    assert [len(p) for p in pages] == [3]


def test_reconciliation_lists_every_file_with_its_listed_date_and_fetches_by_url(waf):
    files = catalogue(9, per_folder=3)
    waf.set_files(files)
    waf.style = "nginx"
    src = source(waf)
    ids = [i for page in src.list_ids(100) for i in page.ids]
    assert dict(ids) == {waf.url + p: f.modified.replace(tzinfo=timezone.utc) for p, f in files.items()}
    wanted = [waf.url + "g0/s0/record-000001.xml", waf.url + "g0/s0/gone.xml", "http://elsewhere.org/x.xml"]
    fetched = [r for page in src.fetch_by_ids(wanted) for r in page]
    assert [(r.source_id, r.metadata_modified) for r in fetched] == [
        (wanted[0], files["g0/s0/record-000001.xml"].modified.replace(tzinfo=timezone.utc))]
    assert not any("elsewhere" in path for path, _, _ in waf.requests)
    assert src.count() is None


def test_a_url_of_one_xml_file_is_a_waf_of_that_file(waf):
    waf.set_files(catalogue(3, per_folder=3))
    records, listing = listed(source(waf, url=waf.url + "g0/s0/record-000002.xml"))
    assert [r.title for r in records] == ["Record 2"] and listing.complete
    assert [path for path, _, _ in waf.requests] == ["/waf/g0/s0/record-000002.xml"]


# -- harvester validate ------------------------------------------------------------------------------
def test_validate_reads_a_folder_and_an_iso_document():
    from harvester.http.guard import FetchPolicy
    from harvester.pipeline.validate import validate_file, validate_url

    with WafServer(catalogue(6, per_folder=3)) as server:
        report = validate_url(server.url, "iso-waf", fetcher=FetchPolicy(allow_private=True))
    assert report.kind == "iso-waf" and report.records == 6 and report.failed == 0
    body = derive(real_record(RECORDS[1]), title="One file")
    report = validate_file(io.BytesIO(body), "iso-waf", "record.xml")
    assert report.records == 1 and report.failed == 0
    bomb = validate_file(io.BytesIO(nested_entities_rdfxml()), "iso-waf", "bomb.xml")
    assert bomb.failed == 1


def test_a_waf_url_that_redirects_is_walked_where_it_leads(waf):
    waf.set_files(catalogue(4, per_folder=4))
    src = source(waf, url=waf.base_url + "/waf")  # no trailing slash: added; and the server's 301 is followed
    records, listing = listed(src)
    assert len(records) == 4 and listing.complete
    src = source(waf, url=waf.base_url + "/waf/g0/s0")  # a sub-folder without its slash
    assert len(listed(src)[0]) == 4
    waf.moved = {"/old/": "/waf/"}  # the WAF moved: its files are where the redirect leads
    src = source(waf, url=waf.base_url + "/old/")
    records, listing = listed(src)
    assert {r.source_id for r in records} == {waf.url + p for p in waf.files} and listing.complete


def test_gzipped_listings_and_files_are_read(waf):
    waf.set_files(catalogue(6, per_folder=3))
    waf.gzip = True
    src = source(waf)
    records, listing = listed(src)
    assert len(records) == 6 and all(r.ok for r in records) and listing.complete
    assert src.bytes_received < sum(f.size for f in waf.files.values()) / 3  # counted as they came: compressed


def test_a_listing_cut_short_is_asked_again_and_never_read_as_the_folder(waf):
    waf.set_files(catalogue(6, per_folder=3))
    waf.cut_listings = 2  # the root and the first sub-listing: half a page, then the connection closed
    src = source(waf, max_retries=2)
    records, listing = listed(src)
    assert len(records) == 6 and listing.complete
    assert [status for path, _, status in waf.listing_requests()][:2] == [200, 200]
    assert len(waf.listing_requests()) == src.folders_read + 2
    waf.cut_listings = 10
    with pytest.raises(RetriesExhausted, match="the body was cut"):
        listed(source(waf, max_retries=1))


def test_a_listing_closed_early_without_a_length_is_told_by_its_missing_end(waf):
    waf.set_files(catalogue(6, per_folder=3))
    waf.cut_listings, waf.cut_quietly = 1, True
    src = source(waf, max_retries=2)
    records, listing = listed(src)
    assert len(records) == 6 and listing.complete and len(waf.listing_requests()) == src.folders_read + 1
    waf.cut_listings = 10
    with pytest.raises(RetriesExhausted, match="the listing was cut short"):
        listed(source(waf, max_retries=1))


def test_a_waf_given_by_its_index_page_is_the_folder_of_that_page(waf):
    waf.set_files(catalogue(4, per_folder=2))
    src = source(waf, url=waf.url + "index.html")
    records, listing = listed(src)
    assert {r.source_id for r in records} == {waf.url + p for p in waf.files} and listing.complete
    assert src.url == waf.url


def test_the_source_can_what_the_registry_says():
    from harvester.sources import CAPABILITIES, NO_COUNT

    assert IsoWafSource.capabilities == CAPABILITIES["iso-waf"]
    assert IsoWafSource.capabilities.resumable and CAPABILITIES["iso-waf"].count == NO_COUNT
