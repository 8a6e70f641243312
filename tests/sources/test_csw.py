"""The CSW source (harvester.sources.csw) on real CSW answers (tests/data/csw/, see the READMEs
there): ISO 19139 and Dublin Core mapping, PT_FreeText translations, and, against the local CSW
server (testing/csw_portal.py) over real HTTP: paging by nextRecord, a loop cut, ExceptionReports,
the modified-since filter (applied, ignored, rejected), retries."""
from __future__ import annotations

import logging
import xml.etree.ElementTree as ET
from datetime import datetime, timezone
from pathlib import Path

import pytest

from harvester.http import HttpFetcher
from harvester.sources.base import FilterRejected, Listing, SourceError, SourceUnavailable
from harvester.sources.csw import CswSource, dc_record, iso_record, records_of
from harvester.testing.csw_portal import CswServer, derive, load_records, record_id

DATA = Path(__file__).resolve().parents[1] / "data" / "csw"
INSPIRE = DATA / "iso_getrecords_inspire.xml"
PYCSW_ISO = DATA / "iso_getrecords_pycsw.xml"
PYCSW_DC = DATA / "dc_getrecords_pycsw.xml"


def url_of(i):
    return f"https://csw.example.org/csw#{i}"


def parsed(path: Path, language=None):
    out = []
    for e in records_of(ET.parse(path).getroot()):
        out.append(dc_record(e, url_of) if e.tag.endswith("}Record") else iso_record(e, url_of, language))
    return out


def extras(record) -> dict:
    return {e["key"]: e["value"] for e in record.raw["extras"]}


def source(server: CswServer, schema="iso", **kw) -> CswSource:
    return CswSource(server.url, fetcher=HttpFetcher(server.url, backoff=0.01, max_backoff=0.05, **kw), schema=schema)


# -- mapping of the real answers ------------------------------------------------------------------
def test_a_real_geonetwork_iso_answer_maps_every_field_and_keeps_pt_freetext_translations():
    suvim, zamg = parsed(INSPIRE)
    assert suvim.ok and zamg.ok
    assert suvim.source_id == "8dad9c98-0512-4845-a2bf-3ace1c93df6f"
    assert suvim.title == "SUVIM station network WMS"
    assert suvim.description.startswith("The Solar Ultraviolet - Visible Irradiance Monitoring network (SUVIM)")
    assert suvim.organization == "National Geographic Institute"
    assert suvim.raw["organization"] == {"title": "National Geographic Institute", "name": "national-geographic-institute"}
    assert suvim.metadata_modified == datetime(2024, 7, 5, 13, 35, 37, tzinfo=timezone.utc)
    assert suvim.raw["license_id"] == "No limitations on public access"
    assert suvim.raw["resources"] == [{
        "url": "https://wms.ngi.be/inspire/aeronomie/service?request=GetCapabilities&service=WMS&version=1.3.0",
        "format": "OGC:WMS", "name": "", "description": "View service"}]
    translations = suvim.raw["translations"]
    assert set(translations["title"]) == {"en", "fr", "nl", "de"}
    assert set(translations["keywords"]) == {"en", "fr", "nl", "de"}
    assert translations["description"]["en"] == suvim.raw["notes"]
    # the organisation's translations stay in the extras with everything else not mapped
    ex = extras(suvim)
    assert "gmd:MD_Metadata/gmd:contact/gmd:CI_ResponsibleParty/gmd:organisationName/gmd:PT_FreeText/gmd:textGroup/" \
           "gmd:LocalisedCharacterString" in ex
    assert "Institut géographique national" in ex["gmd:MD_Metadata/gmd:contact/gmd:CI_ResponsibleParty/"
                                                  "gmd:organisationName/gmd:PT_FreeText/gmd:textGroup/"
                                                  "gmd:LocalisedCharacterString"]
    assert not any(k.startswith("gmd:MD_Metadata/gmd:fileIdentifier") for k in ex)
    assert len(suvim.tags) == 33
    assert zamg.organization == "ZAMG - Zentralanstalt für Meteorologie und Geodynamik"
    assert zamg.raw["translations"]["title"] == {"de": "CSW Suchdienst der ZAMG"}


def test_the_preferred_language_picks_the_translation():
    suvim, _ = parsed(INSPIRE, language="fr")
    assert suvim.organization == "Institut géographique national"
    assert suvim.source_id == "8dad9c98-0512-4845-a2bf-3ace1c93df6f"


def test_pycsw_iso_records_map_with_date_only_stamps():
    records = parsed(PYCSW_ISO)
    assert [r.source_id for r in records] == ["3e9a8c05", "366f6257-19eb-4f20-ba78-0698ac4aae77",
                                              "75a7eb5e-336e-453d-ab06-209b1070d396",
                                              "a7308c0a-b748-48e2-bab7-0a608a51d416",
                                              "0173e0d7-6ea9-4407-b846-f29d6bfa9903"]
    assert records[0].metadata_modified == datetime(2011, 4, 18, tzinfo=timezone.utc)
    assert records[1].title == "Aerial Photos" and records[1].organization == "YPAAT"
    assert records[1].raw["license_id"] == "no limitations"
    assert all(r.raw["resources"] and r.raw["resources"][0]["url"] for r in records)


def test_dublin_core_records_map_and_one_without_a_title_fails_with_its_reason():
    records = parsed(PYCSW_DC)
    assert [r.source_id for r in records] == [
        "urn:uuid:19887a8a-f6b0-4a63-ae56-7fba0e17801f", "urn:uuid:1ef30a8b-876d-4828-9246-c37ab4510bbd",
        "urn:uuid:66ae76b7-54ba-489b-a582-0f0633d96493", "urn:uuid:6a3de50b-fa66-4b58-a0e6-ca146fdd18d4",
        "urn:uuid:784e2afd-a9fd-44a6-9a92-a3848371c8ec"]
    lorem, untitled, _, vegetation, aliquam = records
    assert lorem.title == "Lorem ipsum" and lorem.tags == ["Tourism--Greece"]
    assert lorem.description.startswith("Quisque lacus diam")
    assert extras(lorem)["dct:spatial"] == "GR-22"
    assert not untitled.ok and "urn:uuid:1ef30a8b-876d-4828-9246-c37ab4510bbd" in untitled.error
    assert "dc:title" in untitled.error
    assert extras(vegetation)["dc:subject@scheme"] == "http://www.digest.org/2.1"
    assert aliquam.metadata_modified == datetime(2006, 5, 12, tzinfo=timezone.utc)


def test_an_edit_anywhere_in_an_iso_record_changes_its_metadata_hash():
    md = records_of(ET.parse(INSPIRE).getroot())[0]
    before = iso_record(md, url_of)
    md.find(".//{http://www.isotc211.org/2005/gmd}city/{http://www.isotc211.org/2005/gco}CharacterString").text = "Gent"
    after = iso_record(md, url_of)
    assert before.metadata_hash != after.metadata_hash
    assert before.content_hash == after.content_hash


# -- over HTTP against the local CSW server -------------------------------------------------------
def synthetic(n: int) -> list[ET.Element]:
    base = load_records(PYCSW_ISO)
    return [derive(base[i % len(base)], f"rec-{i:03d}", title=f"Record {i}",
                   modified=f"2024-01-{1 + i % 28:02d}T00:00:00Z") for i in range(n)]


@pytest.fixture
def csw():
    with CswServer() as server:
        yield server


def test_paging_follows_next_record_to_the_end(csw):
    csw.set_records(load_records(INSPIRE) + load_records(PYCSW_ISO) + synthetic(16))
    src = source(csw)
    listing = Listing()
    pages = list(src.iter_records(None, 5, listing))
    assert [len(p) for p in pages] == [5, 5, 5, 5, 3]
    assert [r.source_id for p in pages for r in p] == csw.ids()
    assert listing.complete and src.total == 23
    starts = [r["startposition"] for r in csw.getrecords_requests()]
    assert starts == ["1", "6", "11", "16", "21"]
    assert all(r["outputschema"] == "http://www.isotc211.org/2005/gmd" and r["resulttype"] == "results"
               and r["elementsetname"] == "full" for r in csw.getrecords_requests())


def test_dublin_core_listing(csw):
    csw.set_records(load_records(PYCSW_DC))
    src = source(csw, schema="dc")
    records = [r for p in src.iter_records(None, 2, Listing()) for r in p]
    assert [r.source_id for r in records] == csw.ids()
    assert sum(not r.ok for r in records) == 1
    assert csw.getrecords_requests()[0]["typenames"] == "csw:Record"


def test_a_next_record_that_does_not_advance_is_cut_with_a_warning_and_the_listing_is_incomplete(csw, caplog):
    csw.set_records(synthetic(12))
    csw.stuck_next = 1
    src = source(csw)
    listing = Listing()
    with caplog.at_level(logging.WARNING):
        records = [r for p in src.iter_records(None, 5, listing) for r in p]
    assert len(records) == 5 and not listing.complete and src.loop_cut
    assert "does not advance" in caplog.text
    csw.stuck_next = 6  # advances once, then repeats
    csw.requests.clear()
    listing = Listing()
    records = [r for p in src.iter_records(None, 5, listing) for r in p]
    assert len(records) == 10 and not listing.complete and src.loop_cut


def test_list_ids_refuses_a_cut_listing(csw, caplog):
    # issue 36: a listing cut by a nextRecord that does not advance lacks records the portal still
    # has; reconciling with it would remove them, so list_ids fails instead
    csw.set_records(synthetic(12))
    csw.stuck_next = 6
    src = source(csw)
    with pytest.raises(SourceError, match=r"the identifier listing was cut short \(2 pages read"):
        list(src.list_ids(5))
    assert "does not advance" in caplog.text


def test_a_server_without_counts_capping_its_pages_is_listed_to_the_empty_page(csw):
    # no numberOfRecordsMatched, no nextRecord, at most 3 a page where 5 were asked: a short page
    # is no proof of the end; the empty page after the last is
    csw.set_records(synthetic(12))
    csw.omit_counts, csw.max_page_size = True, 3
    src = source(csw)
    listing = Listing()
    records = [r for p in src.iter_records(None, 5, listing) for r in p]
    assert len({r.source_id for r in records}) == len(records) == 12 and listing.complete
    assert [r["startposition"] for r in csw.getrecords_requests()] == ["1", "4", "7", "10", "13"]
    assert len([i for p in source(csw).list_ids(5) for i in p.ids]) == 12


@pytest.mark.parametrize("status", [200, 400])
def test_exception_report_from_the_real_fixture_is_a_source_error(csw, status):
    csw.canned = (status, (DATA / "exception_report.xml").read_bytes())
    src = source(csw)
    with pytest.raises(SourceError) as err:
        list(src.iter_records(None, 10, Listing()))
    assert not isinstance(err.value, FilterRejected)
    assert csw.url in str(err.value) and "InvalidParameterValue" in str(err.value)
    assert "dc:foo" in str(err.value) and src.requests_made == 1


def test_the_modified_filter_is_sent_and_applied(csw):
    csw.set_records(synthetic(20))
    src = source(csw)
    since = datetime(2024, 1, 15, tzinfo=timezone.utc)
    records = [r for p in src.iter_records(since, 100, Listing()) for r in p]
    assert records and all(r.metadata_modified >= since for r in records)
    assert {r.source_id for r in records} == {f"rec-{i:03d}" for i in range(20) if 1 + i % 28 >= 15}
    sent = csw.getrecords_requests()[0]
    assert sent["constraintlanguage"] == "FILTER" and "apiso:Modified" in sent["constraint"]
    assert "2024-01-15T00:00:00Z" in sent["constraint"]


def test_a_server_ignoring_the_filter_is_detected(csw):
    csw.set_records(synthetic(20))
    csw.ignore_filter = True
    with pytest.raises(FilterRejected, match="ignored the modified-since filter"):
        list(source(csw).iter_records(datetime(2024, 1, 15, tzinfo=timezone.utc), 100, Listing()))


def test_a_server_refusing_the_filter_raises_filter_rejected(csw):
    csw.set_records(synthetic(3))
    csw.reject_filter = True
    with pytest.raises(FilterRejected, match="InvalidParameterValue"):
        list(source(csw).iter_records(datetime(2024, 1, 15, tzinfo=timezone.utc), 100, Listing()))
    # the same server lists in full
    assert len([r for p in source(csw).iter_records(None, 100, Listing()) for r in p]) == 3


def test_transient_failures_are_retried_and_counted(csw):
    csw.set_records(synthetic(4))
    csw.fail_next(1, 503)
    csw.fail_next(1, 429, retry_after="0")
    csw.fail_next(1, truncated=True)
    src = source(csw)
    records = [r for p in src.iter_records(None, 100, Listing()) for r in p]
    assert len(records) == 4 and src.requests_made == 4


def test_retries_spent_is_source_unavailable(csw):
    csw.set_records(synthetic(1))
    csw.fail_next(10, 503)
    with pytest.raises(SourceUnavailable, match=csw.url.split("//")[1]):
        list(source(csw, max_retries=2).iter_records(None, 100, Listing()))


def test_a_404_fails_at_once_naming_the_url(csw):
    src = CswSource(csw.base_url + "/nope", fetcher=HttpFetcher(csw.base_url + "/nope", max_retries=3))
    with pytest.raises(SourceError) as err:
        list(src.iter_records(None, 10, Listing()))
    assert "HTTP 404" in str(err.value) and "/nope" in str(err.value)
    assert src.requests_made == 1


def test_get_record_by_id(csw):
    csw.set_records(load_records(INSPIRE))
    src = source(csw)
    record = src.fetch_by_id("eeae2de7-0a09-4b69-b7a0-0b6b20903fd5")
    assert record.title == "CSW Suchdienst der ZAMG"
    assert src.fetch_by_id("missing") is None
    assert record_id(load_records(INSPIRE)[1]) == record.source_id


# -- reconciliation --------------------------------------------------------------------------------
def test_count_is_one_hits_request(csw):
    csw.set_records(synthetic(7))
    src = source(csw)
    assert src.count() == 7 and src.requests_made == 1
    assert csw.getrecords_requests()[0]["resulttype"] == "hits"


def test_list_ids_pages_summaries_with_the_records_own_modified_times(csw):
    records = load_records(INSPIRE) + synthetic(5)
    csw.set_records(records)
    src = source(csw)
    pages = list(src.list_ids(3))
    assert [len(p.ids) for p in pages] == [3, 3, 1]
    assert all(not p.records and p.unusable == 0 for p in pages)
    assert all(r["elementsetname"] == "summary" for r in csw.getrecords_requests())
    listed = dict(i for p in pages for i in p.ids)
    full = {r.source_id: r.metadata_modified for p in src.iter_records(None, 100, Listing()) for r in p}
    assert listed == full      # the same ids and times the full records carry
    assert listed["8dad9c98-0512-4845-a2bf-3ace1c93df6f"] == datetime(2024, 7, 5, 13, 35, 37, tzinfo=timezone.utc)


def test_list_ids_of_a_server_ignoring_the_element_set_gives_the_whole_records(csw):
    csw.set_records(synthetic(4))
    csw.ignore_element_set = True
    pages = list(source(csw).list_ids(10))
    assert len(pages) == 1 and len(pages[0].records) == 4 and pages[0].ignored == "elementSetName=summary"
    assert [r.source_id for r in pages[0].records] == [i for i, _ in pages[0].ids]


def test_fetch_by_ids_asks_get_record_by_id_and_leaves_out_what_is_gone(csw):
    csw.set_records(synthetic(5))
    src = source(csw)
    pages = list(src.fetch_by_ids(["rec-000", "rec-003", "gone", "rec-004"], per_request=2))
    assert [[r.source_id for r in p] for p in pages] == [["rec-000", "rec-003"], ["rec-004"]]
    by_id = [r for r in csw.requests if r.get("request") == "GetRecordById"]
    assert [r["id"] for r in by_id] == ["rec-000,rec-003", "gone,rec-004"]
    assert list(src.fetch_by_ids(["gone"])) == []       # a NotFound ExceptionReport: nothing, no error


# -- hostile and broken XML -------------------------------------------------------------------------
LAUGHS = (b'<?xml version="1.0"?>\n<!DOCTYPE lolz [\n<!ENTITY lol "lol">\n'
          + b"".join(b'<!ENTITY lol%d "%s">\n' % (n, (b"&lol%d;" % (n - 1) if n > 1 else b"&lol;") * 10)
                     for n in range(1, 10))
          + b']>\n<csw:GetRecordsResponse xmlns:csw="http://www.opengis.net/cat/csw/2.0.2">&lol9;'
            b"</csw:GetRecordsResponse>")
EXTERNAL = (b'<?xml version="1.0"?>\n<!DOCTYPE csw:GetRecordsResponse [<!ENTITY secret SYSTEM "file:///etc/passwd">]>'
            b'<csw:GetRecordsResponse xmlns:csw="http://www.opengis.net/cat/csw/2.0.2">&secret;'
            b"</csw:GetRecordsResponse>")


@pytest.mark.parametrize("body,name", [(LAUGHS, "lolz"), (EXTERNAL, "csw:GetRecordsResponse")],
                         ids=["billion-laughs", "external-entity"])
def test_an_answer_declaring_a_doctype_is_refused_unread_naming_the_url(csw, body, name):
    """Entity declarations live in a DOCTYPE, which no CSW answer has: refused before any entity is
    read, at once (before, expat refused them too, its amplification limit or an undefined entity, but as
    "not XML": retried, then reported as the portal unavailable)."""
    csw.canned = (200, body)
    src = source(csw, max_retries=3)
    with pytest.raises(SourceError) as err:
        list(src.iter_records(None, 10, Listing()))
    assert f"declares a DOCTYPE ({name}): refused unread" in str(err.value)
    assert csw.url.split("//")[1] in str(err.value)
    assert not isinstance(err.value, SourceUnavailable) and src.requests_made == 1
    with pytest.raises(SourceError, match="declares a DOCTYPE"):
        src.fetch_by_id("any")


def test_an_html_page_with_its_doctype_is_a_page_not_xml_and_retried(csw):
    csw.canned = (200, b"<!DOCTYPE html>\n<html><head><title>Maintenance</title></head>"
                       b"<body>Back soon<br></body></html>")
    src = source(csw, max_retries=1)
    with pytest.raises(SourceUnavailable, match="not XML"):
        list(src.iter_records(None, 10, Listing()))
    assert src.requests_made == 2


class PlantedCsw(CswServer):
    """Its answers with PLANTED-SOH written as ``&#x1;``, a character reference XML 1.0 forbids."""

    def answer(self, params):
        status, body = super().answer(params)
        return status, body.replace(b"PLANTED-SOH", b"&#x1;")


def test_a_character_xml_forbids_is_its_records_outcome_in_listings_ids_and_get_record_by_id():
    """One &#x1; used to fail the whole page's parse (retried as "not XML", then the run)."""
    records = synthetic(4)
    records[1] = derive(records[1], "rec-001", title="Title PLANTED-SOH here")
    records[2] = derive(records[2], "rec-PLANTED-SOH-002")
    with PlantedCsw(records) as server:
        src = source(server)
        got = {r.source_id: r for p in src.iter_records(None, 10, Listing()) for r in p}
        assert list(got) == ["rec-000", "rec-001", "rec-\\x01-002", "rec-003"]
        assert got["rec-001"].ok and got["rec-001"].title == "Title \ufffd here"
        assert [(p.code, p.value) for p in got["rec-001"].problems if p.code == "invalid-xml-character"] == [
            ("invalid-xml-character", "\\x01")]
        assert not got["rec-\\x01-002"].ok
        assert [p.code for p in got["rec-\\x01-002"].problems] == ["unstorable-identifier"]
        assert not any(p.code == "invalid-xml-character" for i in ("rec-000", "rec-003") for p in got[i].problems)
        # reconciliation names the failed record as its outcome does
        assert [i for p in source(server).list_ids(10) for i, _ in p.ids] == list(got)
        fetched = [r for p in source(server).fetch_by_ids(["rec-001", "rec-003"]) for r in p]
        assert [(r.source_id, r.title) for r in fetched] == [("rec-001", "Title \ufffd here"), ("rec-003", "Record 3")]
        assert source(server).fetch_by_id("rec-001").problems[-1].code == "invalid-xml-character"
