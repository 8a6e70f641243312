"""The SDMX source (harvester.sources.sdmx) on the real structure messages of
../shared/portal-samples/sdmx/ (INSEE's 663 dataflows in French and English, Eurostat's annotations,
ISTAT's answer with references, IMF's SDMX-ML 3.0, an assembled multi-agency file), and against the
local SDMX REST service (testing/sdmx_portal.py) over real HTTP: one message read as a stream in
pages, conditional requests, the error answers of sdmx-rest (404 error 100, 413 error 510),
retries, and hostile answers. Expected ids are read from the files with a regular expression, not
through the source's parser."""
from __future__ import annotations

import json
import re
from base64 import b64decode
from datetime import datetime, timezone

import pytest

from harvester.config.portals import Portal
from harvester.http import HttpFetcher
from harvester.http.guard import TooLarge
from harvester.pipeline import validate as v
from harvester.sources import source_for
from harvester.sources.base import Listing, SourceError, SourceUnavailable
from harvester.sources.sdmx import MAX_DATAFLOW_CHARS, SdmxError, SdmxSource, asked_as_is, service_of
from harvester.testing.hostile_documents import nested_entities_rdfxml
from harvester.testing.hostile_http import Endless, HostileServer
from harvester.testing.samples import portal_sample
from harvester.testing.sdmx_portal import INSEE, SdmxServer, bench_catalogue, derive, insee_dataflows

ESTAT = "dataflow-estat-gov_10q_ggnfa-fr-de-en-reduced-2023-01-26.xml"
ISTAT = "dataflow-istat-47_850-references-datastructure-2026-05-18.requests-cache.json"
IMF = "dataflow-imf-01r-sdmx3-2025-01-10.xml"
ASSEMBLED = "dataflows-assembled-estat-spc-nb-ceres.xml"


def insee_ids() -> list[str]:
    text = portal_sample("sdmx", INSEE).read_text(encoding="utf-8")
    return [f"{a}:{i}" for i, a in re.findall(r'<str:Dataflow id="([^"]+)" urn="[^"]+" agencyID="([^"]+)"', text)]


def fetcher(url: str, **kw) -> HttpFetcher:
    return HttpFetcher(url, backoff=0.01, max_backoff=0.05, politeness_delay=0, **kw)


def listed(source, page_size=1000, validators=None) -> tuple[list, Listing, list[int]]:
    listing = Listing()
    pages = list(source.iter_records(None, page_size, listing, validators))
    return [r for p in pages for r in p], listing, [len(p) for p in pages]


def served(server: SdmxServer, name: str, path: str | None = None) -> str:
    """A real recorded message served as it is (its own prefixes and version) at ``path``."""
    path = path or f"/files/{name}"
    server.documents[path] = portal_sample("sdmx", name).read_bytes()
    return server.base_url + path


def codes(record) -> set[str]:
    return {p.code for p in record.reported()}


def extras(record) -> dict:
    return {e["key"]: e["value"] for e in record.raw["extras"]}


@pytest.fixture
def sdmx():
    with SdmxServer() as server:
        yield server


# -- the real messages ------------------------------------------------------------------------------------
def test_insee_663_dataflows_keep_both_languages_and_the_portals_language_picks_the_title(sdmx):
    sdmx.set_dataflows(insee_dataflows())
    records, listing, pages = listed(SdmxSource(sdmx.url, fetcher=fetcher(sdmx.url), language="fr"), page_size=100)
    assert [r.source_id for r in records] == insee_ids() and len(records) == 663
    assert pages == [100] * 6 + [63] and listing.complete and all(r.ok for r in records)
    first = records[0]
    assert first.source_id == "FR1:ACT-TRIM-ANC" and first.organization == "FR1"
    assert first.title == "Activité par sexe et âge - Séries trimestrielles" and first.language == "fr"
    assert first.raw["translations"]["title"] == {"fr": "Activité par sexe et âge - Séries trimestrielles",
                                                  "en": "Activity by sex and age - Quarterly series"}
    assert first.url == f"{sdmx.url}/dataflow/FR1/ACT-TRIM-ANC/1.0"
    assert first.raw["resources"][0]["url"] == f"{sdmx.url}/data/FR1,ACT-TRIM-ANC,1.0"
    assert first.raw["version"] == "1.0" and first.metadata_modified is None  # INSEE writes no update annotation
    assert extras(first)["sdmx:structure"] == {
        "id": "ACT-TRIM-ANC", "version": "1.0", "agencyID": "FR1", "package": "datastructure",
        "class": "DataStructure", "urn": "urn:sdmx:org.sdmx.infomodel.datastructure.DataStructure=FR1:ACT-TRIM-ANC(1.0)"}
    assert extras(first)["sdmx:urn"] == "urn:sdmx:org.sdmx.infomodel.datastructure.Dataflow=FR1:ACT-TRIM-ANC(1.0)"
    # without a language (or one the message lacks), English; the record says which it chose
    english = listed(SdmxSource(sdmx.url, fetcher=fetcher(sdmx.url)))[0][0]
    assert (english.title, english.language) == ("Activity by sex and age - Quarterly series", "en")
    german = listed(SdmxSource(sdmx.url, fetcher=fetcher(sdmx.url), language="de"))[0][0]
    assert german.language == "en" and german.content_hash == english.content_hash
    assert english.raw["translations"] == first.raw["translations"]
    # one request for the whole list: the standard's structure query, its defaults spelled out
    path, params, headers = sdmx.requests[0]
    assert path == "/rest/dataflow/all/all/latest" and params == {"detail": "full", "references": "none"}
    assert headers["accept"].startswith("application/vnd.sdmx.structure+xml;version=2.1")


def test_eurostat_annotations_give_the_update_time_with_an_offset_without_colon(sdmx):
    url = served(sdmx, ESTAT)
    (record,), listing, _ = listed(SdmxSource(url, fetcher=fetcher(url), language="de"))
    assert listing.complete and record.ok
    assert record.source_id == "ESTAT:GOV_10Q_GGNFA" and record.organization == "ESTAT"
    assert record.title == "Vierteljährliche nichtfinanzielle Staatskonten" and record.language == "de"
    assert set(record.raw["translations"]["title"]) == {"fr", "de", "en"}
    # UPDATE_DATA and UPDATE_STRUCTURE: 2023-01-23T11:00:00+0100
    assert record.metadata_modified == datetime(2023, 1, 23, 10, 0, tzinfo=timezone.utc)
    annotations = extras(record)["sdmx:annotations"]
    assert [a["type"] for a in annotations] == [
        "DISSEMINATION_DOI_XML", "DISSEMINATION_OBJECT_TYPE", "ESMS_HTML", "ESMS_SDMX", "OBS_COUNT",
        "OBS_PERIOD_OVERALL_LATEST", "OBS_PERIOD_OVERALL_OLDEST", "SOURCE_INSTITUTIONS", "UPDATE_DATA",
        "UPDATE_STRUCTURE"]
    assert "10.2908/GOV_10Q_GGNFA" in annotations[0]["title"]
    assert annotations[2]["url"] == "https://ec.europa.eu/eurostat/cache/metadata/en/gov_10q_ggnfa_esms.htm"
    assert annotations[7]["texts"] == {"fr": "Eurostat", "en": "Eurostat", "de": "Eurostat"}
    assert extras(record)["sdmx:structure"]["version"] == "43.0"
    # the message's codelists and concept schemes (its references) are not dataflows
    assert listing.complete and sdmx.requests[0][1] == {}  # a url naming a file is asked as it is


def test_istats_answer_with_references_read_as_recorded(sdmx):
    recorded = json.loads(portal_sample("sdmx", ISTAT).read_text())
    body = b64decode(recorded["_content"])
    path = "/SDMXWS/rest/dataflow/all/47_850/latest"
    sdmx.documents[path] = body
    url = sdmx.base_url + path + "?references=datastructure"
    (record,), listing, _ = listed(SdmxSource(url, fetcher=fetcher(url), language="it"))
    assert record.source_id == "IT1:47_850" and record.language == "it"
    assert record.title == "Servizi socio-educativi per la prima infanzia"  # (its double space made one)
    assert record.metadata_modified == datetime(2025, 11, 14, 16, 15, 51, 591000, tzinfo=timezone.utc)
    assert record.url == f"{sdmx.base_url}/SDMXWS/rest/dataflow/IT1/47_850/1.0"  # the service's own base
    assert extras(record)["sdmx:structure"]["id"] == "DCIS_SERVSOCEDU1"
    assert sdmx.requests[0][1] == {"references": "datastructure"}  # the url's own query, nothing added


def test_an_sdmx_3_message_gives_its_structure_as_a_urn_and_a_rest_2_query(sdmx):
    url = served(sdmx, IMF, "/sdmx/v2/structure/dataflow/IMF/01R/1.0")
    (record,), listing, _ = listed(SdmxSource(url, fetcher=fetcher(url)))
    assert listing.complete and record.ok and record.raw["schema"] == "sdmx-ml-3.0"
    assert record.source_id == "IMF:01R" and record.description.startswith("Exchange Rates and International")
    assert extras(record)["sdmx:structure"] == {"urn": "urn:sdmx:org.sdmx.infomodel.datastructure.DataStructure="
                                                       "IMF:ECOFIN_DSD(1.0)"}
    assert record.url == f"{sdmx.base_url}/sdmx/v2/structure/dataflow/IMF/01R/1.0"
    assert record.raw["resources"][0]["url"] == f"{sdmx.base_url}/sdmx/v2/data/dataflow/IMF/01R/1.0/*"


def test_the_assembled_file_prefixes_redeclared_a_structure_url_and_a_dataflow_known_only_by_its_urn(sdmx):
    url = served(sdmx, ASSEMBLED, "/rest/dataflow/all/all/latest")
    records, listing, _ = listed(SdmxSource(url, fetcher=fetcher(url), language="fr"))
    assert [r.source_id for r in records] == ["ESTAT:NAMA_10_GDP", "SPC:DF_ADBKI", "NB:ANN_FX_SPU"]
    estat, spc, nb = records
    assert estat.title == "GDP and main aggregates" and estat.language == "en"  # no French name
    assert estat.url == "https://ec.europa.eu/eurostat/api/dissemination/sdmx/2.1/dataflow/ESTAT/NAMA_10_GDP/1.0"
    # UPDATE_DATA 2026-04-16T23:00:00+0200 is later than UPDATE_STRUCTURE 2026-01-07T23:00:00+0100
    assert estat.metadata_modified == datetime(2026, 4, 16, 21, 0, tzinfo=timezone.utc)
    assert spc.title == "Indicateurs clés de la Banque asiatique de développement" and spc.language == "fr"
    assert spc.description == "Indicateurs sélectionnés pour les pays et territoires insulaires du Pacifique."
    assert spc.raw["translations"]["description"]["en"].startswith("Selected ADB indicators")
    assert nb.ok and nb.title == "ANN_FX_SPU" and nb.language is None and "title-from-identifier" in codes(nb)
    assert nb.raw["version"] == "1.0" and nb.organization == "NB"


def test_an_edit_a_version_bump_or_an_update_annotation_changes_the_metadata_hash(sdmx):
    base = insee_dataflows()[0]
    sdmx.set_dataflows([base, derive(base, "OTHER")])
    src = SdmxSource(sdmx.url, fetcher=fetcher(sdmx.url))
    before = listed(src)[0][0]
    for changed in (derive(base, version="1.1"), derive(base, updated="2024-03-01T10:00:00+0100")):
        sdmx.set_dataflows([changed])
        after = listed(src)[0][0]
        assert after.source_id == before.source_id == "FR1:ACT-TRIM-ANC"
        assert after.metadata_hash != before.metadata_hash and after.content_hash == before.content_hash
    assert after.metadata_modified == datetime(2024, 3, 1, 9, 0, tzinfo=timezone.utc)


# -- over HTTP ----------------------------------------------------------------------------------------------
def test_an_unchanged_list_answers_304_to_the_last_runs_validators(sdmx):
    sdmx.set_dataflows(insee_dataflows())
    src = SdmxSource(sdmx.url, fetcher=fetcher(sdmx.url))
    records, listing, _ = listed(src)
    assert len(records) == 663 and set(listing.validators) == {"etag", "last_modified"}
    again, second, _ = listed(src, validators=listing.validators)
    assert again == [] and second.not_modified and not second.complete and second.validators == listing.validators
    headers = sdmx.requests[1][2]
    assert headers["if-none-match"] == listing.validators["etag"]
    assert headers["if-modified-since"] == listing.validators["last_modified"]
    assert src.requests_made == 2
    # changed since: the whole list again, new validators
    sdmx.set_dataflows(insee_dataflows()[:-1])
    third_records, third, _ = listed(src, validators=listing.validators)
    assert len(third_records) == 662 and third.complete and third.validators["etag"] != listing.validators["etag"]
    # a service without conditional requests answers the list every time: complete every time
    sdmx.conditional = False
    plain, fourth, _ = listed(src, validators=third.validators)
    assert len(plain) == 662 and fourth.complete and fourth.validators == {}


def test_an_agency_named_in_the_url_is_asked_as_it_is(sdmx):
    base = insee_dataflows()[:3]
    sdmx.set_dataflows(base + [derive(b, agency="ESTAT") for b in base])
    url = f"{sdmx.url}/dataflow/ESTAT/all/latest"
    records, listing, _ = listed(SdmxSource(url, fetcher=fetcher(url)))
    assert {r.source_id.split(":")[0] for r in records} == {"ESTAT"} and len(records) == 3 and listing.complete
    assert records[0].url == f"{sdmx.url}/dataflow/ESTAT/ACT-TRIM-ANC/1.0"
    assert sdmx.requests[0][:2] == ("/rest/dataflow/ESTAT/all/latest", {})


@pytest.mark.parametrize("as_204", [False, True])
def test_a_service_listing_no_dataflows_is_an_empty_listing_that_removes_nothing(sdmx, caplog, as_204):
    sdmx.empty_as_204 = as_204
    records, listing, _ = listed(SdmxSource(sdmx.url, fetcher=fetcher(sdmx.url)))
    assert records == [] and not listing.complete and not listing.not_modified
    assert "the service lists no dataflows" in caplog.text
    assert ("HTTP 204" if as_204 else "SDMX error 100: No Results Found") in caplog.text
    assert len(sdmx.requests) == 1


def test_too_large_an_answer_is_terminal_and_says_to_name_an_agency(sdmx):
    sdmx.set_dataflows(insee_dataflows())
    sdmx.max_message_bytes = 100_000
    src = SdmxSource(sdmx.url, fetcher=fetcher(sdmx.url, max_retries=3))
    with pytest.raises(SdmxError) as err:
        listed(src)
    assert not err.value.transient and err.value.code == "510"
    assert "HTTP 413, SDMX error 510: Response size exceeds service limit" in str(err.value)
    assert f"{sdmx.url}/dataflow/AGENCY/all/latest" in str(err.value) and len(sdmx.requests) == 1


def test_a_service_refusing_detail_and_references_is_asked_without_them(sdmx, caplog):
    sdmx.set_dataflows(insee_dataflows()[:5])
    sdmx.reject_params = True
    records, listing, _ = listed(SdmxSource(sdmx.url, fetcher=fetcher(sdmx.url)))
    assert len(records) == 5 and listing.complete
    assert [r[1] for r in sdmx.requests] == [{"detail": "full", "references": "none"}, {}]
    assert "refused detail=full&references=none (HTTP 400, SDMX error 140" in caplog.text


def test_a_404_without_an_sdmx_error_is_terminal_naming_the_url(sdmx):
    src = SdmxSource(sdmx.base_url + "/nothing-here", fetcher=fetcher(sdmx.base_url, max_retries=3))
    sdmx.canned = (404, b"<html><body>Not Found</body></html>", "text/html")
    with pytest.raises(SdmxError, match=r"HTTP 404 .*is the url the service's REST entry point"):
        listed(src)
    assert len(sdmx.requests) == 1


def test_transient_faults_are_retried_and_a_body_cut_short_is_asked_again_skipping_what_was_listed(sdmx, caplog):
    sdmx.set_dataflows(insee_dataflows())
    sdmx.fail_next(1, 503)
    sdmx.fail_next(1, 429, retry_after="0")
    sdmx.fail_next(1, truncated=True)
    records, listing, _ = listed(SdmxSource(sdmx.url, fetcher=fetcher(sdmx.url, max_retries=3)), page_size=50)
    assert [r.source_id for r in records] == insee_ids() and listing.complete
    assert len(sdmx.requests) == 4 and "broke off after" in caplog.text
    # retries spent: transient
    sdmx.fail_next(9, 503)
    with pytest.raises(SourceUnavailable, match="failed after 3 attempts"):
        listed(SdmxSource(sdmx.url, fetcher=fetcher(sdmx.url, max_retries=2)))


def test_an_html_page_where_the_message_should_be_is_retried(sdmx):
    sdmx.canned = (200, b"<!DOCTYPE html><html><body>Maintenance</body></html>", "text/html")
    with pytest.raises(SourceUnavailable, match="not an SDMX message"):
        listed(SdmxSource(sdmx.url, fetcher=fetcher(sdmx.url, max_retries=1)))
    assert len(sdmx.requests) == 2


# -- hostile and wrong answers --------------------------------------------------------------------------------
SDMX21 = "http://www.sdmx.org/resources/sdmxml/schemas/v2_1"


def message(inner: str, doctype: str = "") -> bytes:
    return (f'<?xml version="1.0"?>{doctype}<mes:Structure xmlns:mes="{SDMX21}/message" '
            f'xmlns:str="{SDMX21}/structure" xmlns:com="{SDMX21}/common"><mes:Structures><str:Dataflows>'
            f"{inner}</str:Dataflows></mes:Structures></mes:Structure>").encode()


def flow(flow_id: str, name: str = "A name") -> str:
    return (f'<str:Dataflow id="{flow_id}" agencyID="X" version="1.0"><com:Name xml:lang="en">{name}</com:Name>'
            "</str:Dataflow>")


@pytest.mark.parametrize("body, expected", [
    (nested_entities_rdfxml(), "declares a DOCTYPE"),
    (message(flow("A", "&e3;"), '<!DOCTYPE mes:Structure [<!ENTITY e0 "x"><!ENTITY e1 "&e0;&e0;">'
                                '<!ENTITY e2 "&e1;&e1;"><!ENTITY e3 "&e2;&e2;">]>'), "declares a DOCTYPE"),
    (message(flow("A", "&x;"), '<!DOCTYPE s SYSTEM "http://evil.example/x.dtd">'), "declares a DOCTYPE"),
    (message(flow("A")).replace(b"</mes:Structure>", b""), "not well-formed XML"),
    (b'{"data": {"dataflows": []}}', "the answer is JSON (SDMX-JSON?)"),
    (f'<mes:GenericData xmlns:mes="{SDMX21}/message"/>'.encode(), "an SDMX-ML 2.1 GenericData message"),
    (b'<rdf:RDF xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#"/>', "not an SDMX-ML structure message"),
    (f'<mes:Error xmlns:mes="{SDMX21}/message" xmlns:com="{SDMX21}/common"><mes:ErrorMessage code="150">'
     f"<com:Text>Semantic error</com:Text></mes:ErrorMessage></mes:Error>".encode(), "SDMX error 150: Semantic error"),
])
def test_hostile_or_wrong_answers_are_refused_with_a_clear_error(sdmx, body, expected):
    sdmx.canned = (200, body, "application/xml")
    with pytest.raises(SourceError) as err:
        listed(SdmxSource(sdmx.url, fetcher=fetcher(sdmx.url, max_retries=2)))
    assert expected in str(err.value) and not err.value.transient
    assert len(sdmx.requests) == 1


def test_a_message_that_never_ends_is_cut_at_the_stream_cap(monkeypatch):
    monkeypatch.setenv("HARVESTER_FETCH_MAX_STREAM_BYTES", "2MB")
    with HostileServer() as hostile:
        head = message("")[:-len(b"</str:Dataflows></mes:Structures></mes:Structure>")]
        url = hostile.serve("/rest/dataflow/all/all/latest",
                            Endless(b"<!-- padding -->" * 4096, prefix=head + flow("A").encode(), cap=64 << 20))
        src = source_for(Portal(name="endless", url=url, type="sdmx", politeness_delay=0, max_retries=0))
        with pytest.raises(TooLarge, match="larger than 2MB"):
            listed(src)


def test_a_dataflow_too_large_fails_alone_and_a_repeated_id_is_its_records_error(sdmx):
    huge = flow("HUGE", "x" * (MAX_DATAFLOW_CHARS + 10))
    sdmx.canned = (200, message(flow("A") + huge + flow("B") + flow("A", "Again")), "application/xml")
    records, listing, _ = listed(SdmxSource(sdmx.url, fetcher=fetcher(sdmx.url)))
    assert [(r.source_id, r.ok) for r in records] == [("X:A", True), ("X:HUGE", False), ("X:B", True), ("X:A", False)]
    assert codes(records[1]) == {"record-too-large"} and codes(records[3]) == {"duplicate-identifier"}
    assert listing.complete


def test_a_dataflow_without_an_id_fails_with_its_reason(sdmx):
    sdmx.canned = (200, message('<str:Dataflow agencyID="X"><com:Name>No id</com:Name></str:Dataflow>' + flow("B")),
                   "application/xml")
    records, _, _ = listed(SdmxSource(sdmx.url, fetcher=fetcher(sdmx.url)))
    assert [r.ok for r in records] == [False, True] and codes(records[0]) == {"no-identifier"}


# -- urls, validation, the bench ------------------------------------------------------------------------------
def test_which_urls_are_asked_as_they_are():
    assert not asked_as_is("https://bdm.insee.fr/series/sdmx")
    assert asked_as_is("https://ec.europa.eu/eurostat/api/dissemination/sdmx/2.1/dataflow/ESTAT")
    assert asked_as_is("https://example.org/saved/dataflows.XML") and asked_as_is("file:///tmp/flows")
    assert service_of("https://bdm.insee.fr/series/sdmx/") == ("https://bdm.insee.fr/series/sdmx", False)
    assert service_of("https://x.org/rest/dataflow/ESTAT/all/latest") == ("https://x.org/rest", False)
    assert service_of("https://x.org/sdmx/v2/structure/dataflow/*/*/~") == ("https://x.org/sdmx/v2", True)
    assert service_of("https://x.org/files/flows.xml") == (None, False)


def test_harvester_validate_reads_a_saved_dataflow_message():
    report = v.validate_path(portal_sample("sdmx", INSEE), "sdmx")
    assert (report.records, report.failed, report.complete) == (663, 0, True)
    # a saved message names no service: its landing pages are the dataflows' urns, no data query
    assert {g["code"] for g in report.groups} == {"no-description", "no-license", "landing-page-not-http",
                                                  "no-distribution"}
    assembled = v.validate_path(portal_sample("sdmx", ASSEMBLED), "sdmx")
    assert (assembled.records, assembled.failed) == (3, 0)
    assert "title-from-identifier" in {g["code"] for g in assembled.groups}
    # an upload, whatever its name, is a document: read as it is
    with open(portal_sample("sdmx", ESTAT), "rb") as fp:
        upload = v.validate_file(fp, "sdmx", "estat-dataflow")
    assert (upload.records, upload.failed) == (1, 0)


def test_a_catalogue_of_thousands_built_from_insees_is_listed_exactly_in_pages():
    server, url = bench_catalogue(2000)
    with server:
        records, listing, _ = listed(SdmxSource(url(), fetcher=fetcher(url()), language="fr"), page_size=1000)
    assert len({r.source_id for r in records}) == 2000 and listing.complete
    assert len({r.metadata_modified for r in records}) == 2000
    assert records[1999].title.endswith("(1999)") and records[0].language == "fr"
    assert all(key_ == r.source_id for key_, r in zip(server.keys(), records))


def test_an_unreadable_update_annotation_is_a_warning_and_the_record_is_stored(sdmx):
    dated = ('<str:Dataflow id="D" agencyID="X" version="1.0"><com:Annotations><com:Annotation>'
             "<com:AnnotationTitle>yesterday</com:AnnotationTitle><com:AnnotationType>UPDATE_DATA</com:AnnotationType>"
             '</com:Annotation></com:Annotations><com:Name xml:lang="en">Dated</com:Name></str:Dataflow>')
    sdmx.canned = (200, message(dated), "application/xml")
    (record,), _, _ = listed(SdmxSource(sdmx.url, fetcher=fetcher(sdmx.url)))
    assert record.ok and record.metadata_modified is None and "bad-optional-date" in codes(record)


def test_an_error_message_no_results_in_a_200_lists_nothing_and_is_not_complete(sdmx):
    sdmx.canned = (200, f'<mes:Error xmlns:mes="{SDMX21}/message" xmlns:com="{SDMX21}/common"><mes:ErrorMessage '
                        f'code="100"><com:Text>Aucun résultat ne correspond à cette requête.</com:Text>'
                        "</mes:ErrorMessage></mes:Error>".encode(), "application/xml")
    records, listing, _ = listed(SdmxSource(sdmx.url, fetcher=fetcher(sdmx.url)))
    assert records == [] and not listing.complete
    # and an empty Dataflows container removes nothing either
    sdmx.canned = (200, message(""), "application/xml")
    records, listing, _ = listed(SdmxSource(sdmx.url, fetcher=fetcher(sdmx.url)))
    assert records == [] and not listing.complete


def test_a_saved_message_gives_the_dataflows_urns_as_landing_pages(sdmx):
    url = served(sdmx, ASSEMBLED)  # a path ending .xml: a document, no service
    records, _, _ = listed(SdmxSource(url, fetcher=fetcher(url)))
    assert [r.url for r in records] == [
        "https://ec.europa.eu/eurostat/api/dissemination/sdmx/2.1/dataflow/ESTAT/NAMA_10_GDP/1.0",  # structureURL
        "urn:sdmx:org.sdmx.infomodel.datastructure.Dataflow=SPC:DF_ADBKI(1.1)",  # made as the standard writes it
        "urn:sdmx:org.sdmx.infomodel.datastructure.Dataflow=NB:ANN_FX_SPU(1.0)"]
    assert all(r.raw["resources"] == [] for r in records)
