"""The DCAT-AP RDF source on real catalogue exports (../shared/dcat-samples/dcat-ap, read in place):
the mapping to CKAN-shaped records, the three RDF syntaxes, languages, identities, bad dates, broken
files, and Hydra paging over a real HTTP server on 127.0.0.1."""
from __future__ import annotations

import json
import logging
import os
import threading
import urllib.request
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import requests
from rdflib import Graph, Literal, URIRef
from rdflib import namespace as ns

from harvester.domain.dataset import normalize_url, sha256_hex, tracked_metadata
from harvester.sources.base import Listing, SourceError
from harvester.sources.dcat_rdf import (DcatRdfSource, RdfParseError, iter_pages, parse_page, rdf_format, records_from_graph)
from harvester.http import HttpFetcher

ROOT = Path(__file__).resolve().parents[2]
DCAT_SAMPLES = Path(os.environ.get("HARVESTER_DCAT_SAMPLES_DIR") or ROOT.parent / "shared" / "dcat-samples" / "dcat-ap")
LOGGER = "harvester.sources.dcat_rdf"

# file -> (rdflib format, number of dcat:Dataset as the samples' README counts them)
PARSEABLE = {
    "udata/udata.xml": ("xml", 2),
    "udata/geonetwork.xml": ("xml", 1),
    "udata/series.xml": ("xml", 1),
    "udata/datara--5a26b0f6-0ccf-46ad-ac58-734054b91977.rdf.xml": ("xml", 1),
    "udata/paged-collection-1.jsonld": ("json-ld", 3),
    "udata/paged-collection-2.jsonld": ("json-ld", 1),
    "udata/partial-collection-1.jsonld": ("json-ld", 3),
    "udata/partial-collection-2.jsonld": ("json-ld", 1),
    "ckanext-dcat/dataset_gov_de.rdf": ("xml", 1),
    "ckanext-dcat/dataset_gob_es.ttl": ("turtle", 1),
    "ckanext-dcatde/catalog-endpoint.rdf": ("xml", 6),
    "ckanext-dcatapit/catalog_dati_unibo.rdf": ("xml", 12),
    "ckanext-dcatapchharvest/catalog.xml": ("xml", 2),
    "ckanext-dcatapchharvest/dataset-datetimes-bad.xml": ("xml", 1),
    "dcat-ap-de/dcat_ap_de-RefImp_TTL_ADVANCED.ttl": ("turtle", 2),
    "dcat-ap-de/dcat_ap_de-RefImp_RDF_ADVANCED.rdf": ("xml", 2),
    "dcat-ap-de/dcat_ap_de-RefImp_JSONLD_ADVANCED.jsonld": ("json-ld", 2),
    "semiceu-dcat-ap/example-ms_catalogue_hvd.ttl": ("turtle", 1),
}
# The records that are failed, and why: this file's one dataset has no text at all (no dct:title).
FAILED = {"ckanext-dcatapchharvest/dataset-datetimes-bad.xml": 1}
DCAT_AP_DE = ["dcat-ap-de/dcat_ap_de-RefImp_TTL_ADVANCED.ttl", "dcat-ap-de/dcat_ap_de-RefImp_RDF_ADVANCED.rdf",
              "dcat-ap-de/dcat_ap_de-RefImp_JSONLD_ADVANCED.jsonld"]
SWISS = "ckanext-dcatapchharvest/catalog.xml"
BEE_JSONLD = "semiceu-dcat-ap/example-bee-population-dataset-series-combined.jsonld"
BEE_TTL = "semiceu-dcat-ap/example-bee-population-dataset-series-combined.ttl"
BEE_CONTEXT = "https://semiceu.github.io/uri.semic.eu-generated/DCAT-AP/releases/3.0.0/html/examples/context.jsonld"
TEST_ORG_PAGE = "http://data.test.org/catalog.jsonld?page="


def sample(name: str) -> bytes:
    path = DCAT_SAMPLES / name
    if not path.exists():
        pytest.fail(f"sample file {path} is missing: tests read ../shared/dcat-samples/dcat-ap "
                    f"(or $HARVESTER_DCAT_SAMPLES_DIR)")
    return path.read_bytes()


def sample_url(name: str) -> str:
    return f"http://samples.test/{name}"


def records(name: str, language: str | None = None):
    graph = parse_page(sample(name), None, sample_url(name))
    return records_from_graph(graph, sample_url(name), language)


def sparql_count(name: str, fmt: str) -> int:
    """Datasets counted straight from rdflib, independently of the source's code."""
    graph = Graph().parse(data=sample(name), format=fmt, publicID=sample_url(name))
    rows = list(graph.query("SELECT (COUNT(DISTINCT ?d) AS ?n) WHERE { ?d a dcat:Dataset }",
                            initNs={"dcat": ns.DCAT}))
    return int(rows[0][0])


@pytest.fixture(autouse=True)
def quiet_rdflib():
    """rdflib logs a traceback for every literal that does not fit its datatype (the bad-dates file)."""
    logging.getLogger("rdflib").setLevel(logging.CRITICAL)
    yield
    logging.getLogger("rdflib").setLevel(logging.NOTSET)


# -- parsing and counts ------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(PARSEABLE))
def test_every_sample_parses_with_its_dataset_count(name):
    fmt, expected = PARSEABLE[name]
    assert sparql_count(name, fmt) == expected
    found = records(name)
    assert len(found) == expected
    failed = [r for r in found if not r.ok]
    assert len(failed) == FAILED.get(name, 0)
    ok = [r for r in found if r.ok]
    assert len({r.source_id for r in ok}) == len(ok)
    for record in ok:
        assert record.title and record.url and record.content_hash and record.metadata_hash
        assert record.raw["id"] == record.source_id
        json.dumps(record.raw)  # stored as jsonb
        tracked_metadata(record.raw)  # what change detection reads


@pytest.mark.parametrize("name", sorted(PARSEABLE))
def test_format_comes_from_the_suffix_and_the_content_type(name):
    fmt, _ = PARSEABLE[name]
    assert rdf_format(None, sample_url(name)) == fmt
    assert rdf_format("text/turtle; charset=utf-8", sample_url(name)) == "turtle"
    assert rdf_format("application/octet-stream", "http://x.test/catalog?page=2") is None


def test_dcat_ap_de_reference_example_is_the_same_in_all_three_syntaxes():
    seen = []
    for name in DCAT_AP_DE:
        found = records(name)
        assert all(r.ok for r in found)
        seen.append({(r.source_id, r.title, r.description, r.content_hash, r.metadata_hash) for r in found})
    assert seen[0] == seen[1] == seen[2]
    assert {(s[0], s[1]) for s in seen[0]} == {
        ("https://example.com/dataset/d4ce4e6e-ab89-44cb-bf5c-33a162c234de#dataset", "Badegewässer in Hamburg"),
        ("https://example.com/dataset/68180d85-df56-48e0-993e-b9da36103a72#dataset",
         "Gebietsgrenzen Polizeikommissariate"),
    }


def test_ckan_shaped_package_from_the_dcat_ap_de_example():
    by_id = {r.source_id: r for r in records(DCAT_AP_DE[0])}
    bathing = by_id["https://example.com/dataset/d4ce4e6e-ab89-44cb-bf5c-33a162c234de#dataset"]
    pkg = bathing.raw
    assert bathing.tags == ["badestelle", "gewaesserqualitaet", "umweltueberwachung", "wasser", "wasserbelastung"]
    bue = "Behörde für Umwelt und Energie (BUE), Amt für Umweltschutz"
    assert pkg["organization"]["title"] == bathing.organization == bue
    assert pkg["organization"]["name"] == "behorde-fur-umwelt-und-energie-bue-amt-fur-umweltschutz"
    assert pkg["groups"] == [{"name": "http://publications.europa.eu/resource/authority/data-theme/ENVI"}]
    assert pkg["license_id"] == "http://dcat-ap.de/def/licenses/dl-by-de/2.0"  # from the distributions
    assert sorted((r["format"], r["url"]) for r in pkg["resources"]) == [
        ("CSV", "http://example.com/badegewaesser/Badegewaesser_messwerte_historisch_HH_2004-2013.zip"),
        ("XML", "http://example.com/badegewaesser/Badegewaesser_HH_2004-2013.zip"),
    ]
    extras = {e["key"]: e["value"] for e in pkg["extras"]}
    assert extras["dcat:contactPoint"]["vcard:fn"] == "Meister, Thomas, Herr"
    assert extras["dcatde:politicalGeocodingURI"] == "http://dcat-ap.de/def/politicalGeocoding/stateKey/02"
    # no dct:modified on the dataset: the catalogue record about it has one
    assert pkg["metadata_modified"] == "2018-04-01T00:00:00"
    assert bathing.metadata_modified == datetime(2018, 4, 1, tzinfo=timezone.utc)
    # no landing page: the record's URL is the dataset's (http) IRI
    assert bathing.url == bathing.source_id
    assert bathing.url_hash == sha256_hex(normalize_url(bathing.source_id))


def test_resources_formats_and_licence_of_a_portal_export():
    by_id = {r.source_id: r for r in records("udata/udata.xml")}
    vanves = by_id["https://vanves-seineouest.opendatasoft.com/explore/dataset/bureau-de-vote-vanves/"]
    assert vanves.organization == "Vanves"
    assert vanves.metadata_modified == datetime(2019, 4, 19, 12, 21, 56, tzinfo=timezone.utc)
    assert {r["format"] for r in vanves.raw["resources"]} == {"csv", "json", "zip"}
    assert all(r["url"].startswith("https://vanves-seineouest.opendatasoft.com/") for r in vanves.raw["resources"])
    swiss = records(SWISS)[0]
    # dct:format absent: the media type's subtype; dcat:downloadURL preferred to dcat:accessURL
    assert sorted((r["format"], r["url"]) for r in swiss.raw["resources"]) == [
        ("html", "https://www.bfs.admin.ch/asset/de/hs-b-00.01-jb-1894"),
        ("html", "https://www.bfs.admin.ch/asset/fr/hs-b-00.01-jb-1894"),
        ("pdf", "https://www.bfs.admin.ch/bfsstatic/dam/assets/346251/master"),
    ]
    assert swiss.raw["license_id"] == "https://creativecommons.org/publicdomain/zero/1.0/"


def test_changed_metadata_changes_only_the_metadata_hash():
    graph = parse_page(sample(DCAT_AP_DE[0]), None, sample_url(DCAT_AP_DE[0]))
    before = {r.source_id: r for r in records_from_graph(graph, "http://c.test/", None)}
    node = URIRef("https://example.com/dataset/68180d85-df56-48e0-993e-b9da36103a72#dataset")
    daily = URIRef("http://publications.europa.eu/resource/authority/frequency/DAILY")
    graph.add((node, ns.DCTERMS.accrualPeriodicity, daily))
    after = {r.source_id: r for r in records_from_graph(graph, "http://c.test/", None)}
    assert after[str(node)].content_hash == before[str(node)].content_hash
    assert after[str(node)].metadata_hash != before[str(node)].metadata_hash
    other = "https://example.com/dataset/d4ce4e6e-ab89-44cb-bf5c-33a162c234de#dataset"
    assert after[other].metadata_hash == before[other].metadata_hash


# -- languages ---------------------------------------------------------------------------------
def test_multilingual_catalogue_keeps_all_five_languages():
    for record in records(SWISS):
        translations = record.raw["translations"]
        assert set(translations["keywords"]) == {"de", "fr", "it", "rm", "en"}
        assert set(translations["title"]) == {"de", "fr"}  # the file has titles in these two only
    first = records(SWISS)[0]
    assert first.raw["translations"]["keywords"]["rm"] == ["Basas statisticas e survistas"]
    assert "Basas statisticas e survistas" in first.tags and "Publikation" in first.tags


def test_preferred_language_picks_the_title():
    french = {r.source_id: r.title for r in records(SWISS, "fr")}
    german = {r.source_id: r.title for r in records(SWISS, "de")}
    default = {r.source_id: r.title for r in records(SWISS, None)}
    assert french["346252@bundesamt-fur-statistik-bfs"] == "Annuaire statistique de la Suisse 1894"
    assert german["346252@bundesamt-fur-statistik-bfs"] == "Statistisches Jahrbuch der Schweiz 1894"
    # no English title, none untagged: the first language in sorted order (de)
    assert default == german
    assert {r.source_id: r.title for r in records(SWISS, "it")} == german
    # Italian and English titles: None -> English, "it" -> Italian
    unibo = "ckanext-dcatapit/catalog_dati_unibo.rdf"
    english = {r.source_id: r for r in records(unibo, None)}
    italian = {r.source_id: r for r in records(unibo, "it")}
    some = "https://dati.unibo.it/dataset/0824deeb-8e76-4281-9120-c2177d0b13ca"
    assert english[some].title == "Financial Statements 2016"
    assert english[some].title == english[some].raw["translations"]["title"]["en"]
    assert italian[some].title == italian[some].raw["translations"]["title"]["it"] != english[some].title
    assert italian[some].content_hash != english[some].content_hash
    assert italian[some].raw["translations"] == english[some].raw["translations"]


def test_english_is_the_fallback_before_any_other_language():
    graph = swiss_graph()
    node = next(n for n in graph.subjects(ns.RDF.type, ns.DCAT.Dataset)
                if (n, ns.DCTERMS.identifier, Literal("346252@bundesamt-fur-statistik-bfs")) in graph)
    graph.add((node, ns.DCTERMS.title, Literal("Statistical Yearbook of Switzerland 1894", lang="en")))

    def title(language):
        found = records_from_graph(graph, sample_url(SWISS), language)
        return next(r.title for r in found if r.source_id == "346252@bundesamt-fur-statistik-bfs")
    assert title(None) == title("it") == title("EN") == "Statistical Yearbook of Switzerland 1894"
    assert title("de") == "Statistisches Jahrbuch der Schweiz 1894"
    assert title("fr") == "Annuaire statistique de la Suisse 1894"


# -- identities --------------------------------------------------------------------------------
def swiss_graph() -> Graph:
    return parse_page(sample(SWISS), None, sample_url(SWISS))


def test_blank_node_datasets_get_stable_ids():
    first, second = records(SWISS), records(SWISS)
    assert [r.source_id for r in first] == [r.source_id for r in second] == [
        "346252@bundesamt-fur-statistik-bfs", "346266@bundesamt-fur-statistik-bfs"]
    assert [r.metadata_hash for r in first] == [r.metadata_hash for r in second]
    assert [r.content_hash for r in first] == [r.content_hash for r in second]
    assert first[0].url == "https://www.bfs.admin.ch/bfs/de/home/statistiken.html"  # the landing page


def test_blank_node_without_identifier_is_named_by_its_landing_page():
    graph = swiss_graph()
    for node in set(graph.subjects(ns.RDF.type, ns.DCAT.Dataset)):
        graph.remove((node, ns.DCTERMS.identifier, None))
    found = records_from_graph(graph, "http://c.test/catalog.rdf", None)
    landing = "https://www.bfs.admin.ch/bfs/de/home/statistiken.html"
    assert {r.source_id for r in found} == {"landing:" + sha256_hex(normalize_url(landing))[:32]}
    assert all(r.ok for r in found)  # both have the same landing page: the listing keeps the first


def test_dataset_without_identifier_or_landing_page_fails_with_its_reason():
    graph = swiss_graph()
    for node in set(graph.subjects(ns.RDF.type, ns.DCAT.Dataset)):
        graph.remove((node, ns.DCTERMS.identifier, None))
        graph.remove((node, ns.DCAT.landingPage, None))
    found = records_from_graph(graph, "http://c.test/catalog.rdf", "de")
    assert len(found) == 2 and not any(r.ok for r in found)
    assert all(r.source_id is None and r.raw["id"] is None for r in found)
    reasons = sorted(r.error for r in found)
    assert "Statistisches Jahrbuch der Schweiz 1894" in reasons[0]
    assert "Statistisches Jahrbuch der Schweiz 1901" in reasons[1]
    assert all("dcat:landingPage" in reason for reason in reasons)
    json.dumps([r.raw for r in found])


# -- dates ---------------------------------------------------------------------------------------
BAD = "ckanext-dcatapchharvest/dataset-datetimes-bad.xml"


def test_bad_dates_are_kept_as_written():
    [record] = records(BAD)
    assert not record.ok and "no dct:title" in record.error  # the file has no text at all
    graph = parse_page(sample(BAD), None, sample_url(BAD))
    node = URIRef("https://swisstopo/123")
    graph.add((node, ns.DCTERMS.title, Literal("Datums-Test")))
    graph.set((node, ns.DCTERMS.modified, Literal("2009-01-35T00:00:00", datatype=ns.XSD.dateTime)))
    [record] = records_from_graph(graph, sample_url(BAD), None)
    # January has no 35th day: DCAT-AP's range for dct:modified is a date, and Harvester's change
    # detection reads it, so the dataset is failed (DCAT-AP validation), naming the value as written.
    assert not record.ok and record.source_id == "https://swisstopo/123"
    assert [(p.code, p.field, p.value) for p in record.problems] == [
        ("bad-range", "dct:modified", "2009-01-35T00:00:00")]
    graph.set((node, ns.DCTERMS.modified, Literal("2021-07-28", datatype=ns.XSD.date)))
    [record] = records_from_graph(graph, sample_url(BAD), None)
    assert record.ok
    assert record.metadata_modified == datetime(2021, 7, 28, tzinfo=timezone.utc)
    temporal = next(e["value"] for e in record.raw["extras"] if e["key"] == "dct:temporal")
    written = json.dumps(temporal)
    for lexical in ("1994-01-01 00:00:00", "2011-15-01", "2001-6-06", "1999-4-4"):
        assert lexical in written


# -- broken files --------------------------------------------------------------------------------
def test_broken_turtle_names_the_url_and_the_line():
    with pytest.raises(RdfParseError) as err:
        parse_page(sample(BEE_TTL), "text/turtle", "http://portal.test/bee.ttl")
    assert "http://portal.test/bee.ttl" in str(err.value) and "line 32" in str(err.value)


def test_remote_jsonld_context_is_never_opened_by_rdflib(monkeypatch):
    opened = []
    monkeypatch.setattr(urllib.request, "urlopen", lambda *a, **k: opened.append(a) or pytest.fail("urlopen"))
    with pytest.raises(RdfParseError) as err:
        parse_page(sample(BEE_JSONLD), "application/ld+json", "http://portal.test/bee.jsonld")
    assert "http://portal.test/bee.jsonld" in str(err.value) and BEE_CONTEXT in str(err.value)

    def refusing(url):
        raise OSError(f"no network in tests: {url}")
    with pytest.raises(RdfParseError) as err:
        parse_page(sample(BEE_JSONLD), "application/ld+json", "http://portal.test/bee.jsonld", fetch=refusing)
    assert "no network in tests" in str(err.value) and "http://portal.test/bee.jsonld" in str(err.value)
    assert opened == []


def test_unparseable_page_names_the_url_and_every_parser_error():
    body = sample("udata/udata.xml")[:3000]  # cut off mid-document
    with pytest.raises(RdfParseError) as err:
        parse_page(body, "application/rdf+xml", "http://portal.test/catalog.rdf?page=3")
    assert "http://portal.test/catalog.rdf?page=3" in str(err.value)
    with pytest.raises(ValueError) as err:
        parse_page(b"<html><body>502 Bad Gateway</body></html>", "text/html", "http://portal.test/catalog")
    message = str(err.value)
    assert "http://portal.test/catalog" in message
    assert all(f"{fmt}:" in message for fmt in ("xml", "turtle", "json-ld"))  # every parser tried says why


# -- paging over HTTP ----------------------------------------------------------------------------
class CatalogServer:
    """Pages served from memory on 127.0.0.1: path (with query) -> (status, content type, body)."""

    def __init__(self):
        self.pages: dict[str, tuple[int, str, bytes]] = {}
        self.requests: list[tuple[str, dict]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                server.requests.append((self.path, {k.lower(): v for k, v in self.headers.items()}))
                status, content_type, body = server.pages.get(self.path, (404, "text/plain", b"not found"))
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self._http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._http.daemon_threads = True
        self.base = f"http://127.0.0.1:{self._http.server_address[1]}"

    def serve(self, path: str, body: bytes, content_type: str = "application/ld+json", status: int = 200) -> str:
        self.pages[path] = (status, content_type, body)
        return self.base + path

    def paths(self) -> list[str]:
        return [path for path, _ in self.requests]


@pytest.fixture
def server():
    srv = CatalogServer()
    thread = threading.Thread(target=srv._http.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv._http.shutdown()
    srv._http.server_close()


def fetch(url: str) -> tuple[bytes, str]:
    resp = requests.get(url, timeout=10)
    resp.raise_for_status()
    return resp.content, resp.headers.get("Content-Type", "")


def local_page(server: CatalogServer, name: str, page: int, edit=None) -> str:
    """A udata page served with its page links pointing at the local server (``edit`` may change the
    parsed JSON-LD first)."""
    text = sample(name).decode("utf-8").replace(TEST_ORG_PAGE, f"{server.base}/catalog.jsonld?page=")
    if edit:
        document = json.loads(text)
        edit(document)
        text = json.dumps(document)
    return server.serve(f"/catalog.jsonld?page={page}", text.encode())


def hydra_node(document: list) -> dict:
    return next(n for n in document if any("hydra" in t and ("Paged" in t or "View" in t) for t in n.get("@type", [])))


def listed(listing) -> list:
    return [record for page in listing for record in page]


@pytest.mark.parametrize("prefix", ["paged-collection", "partial-collection"])
def test_hydra_paging_lists_every_page(server, prefix, caplog):
    first = local_page(server, f"udata/{prefix}-1.jsonld", 1)
    local_page(server, f"udata/{prefix}-2.jsonld", 2)
    caplog.set_level(logging.WARNING, logger=LOGGER)
    listing = iter_pages(first, fetch)
    found = listed(listing)
    assert sorted(r.source_id for r in found) == [f"http://data.test.org/datasets/{i}" for i in (1, 2, 3, 4)]
    assert all(r.ok for r in found)
    assert server.paths() == ["/catalog.jsonld?page=1", "/catalog.jsonld?page=2"]
    assert (listing.pages, listing.listed, listing.complete, listing.loop_cut, listing.total) == (2, 4, True, False, 4)
    assert caplog.records == []


def test_a_page_loop_is_cut_with_a_warning(server, caplog):
    first = local_page(server, "udata/partial-collection-1.jsonld", 1)

    def back_to_page_1(document):
        hydra_node(document)["http://www.w3.org/ns/hydra/core#next"] = [{"@value": first}]
    local_page(server, "udata/partial-collection-2.jsonld", 2, back_to_page_1)
    caplog.set_level(logging.WARNING, logger=LOGGER)
    listing = iter_pages(first, fetch)
    found = listed(listing)
    assert sorted(r.source_id for r in found) == [f"http://data.test.org/datasets/{i}" for i in (1, 2, 3, 4)]
    assert server.paths() == ["/catalog.jsonld?page=1", "/catalog.jsonld?page=2"]
    assert listing.loop_cut and not listing.complete and listing.pages == 2
    [warning] = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert first in warning.getMessage()


def test_datasets_on_two_pages_are_listed_once(server):
    first = local_page(server, "udata/paged-collection-1.jsonld", 1)
    third = f"{server.base}/catalog.jsonld?page=3"

    def on_to_page_3(document):
        hydra_node(document)["http://www.w3.org/ns/hydra/core#nextPage"] = [{"@value": third}]
    local_page(server, "udata/paged-collection-2.jsonld", 2, on_to_page_3)
    local_page(server, "udata/partial-collection-2.jsonld", 3)  # datasets/4 again, no next page
    listing = iter_pages(first, fetch)
    pages = list(listing)
    assert [len(p) for p in pages] == [3, 1]  # page 3 held only a dataset already listed
    assert listing.pages == 3 and listing.listed == 4 and listing.complete


def test_page_limit_ends_the_listing_with_a_warning(server, caplog):
    first = local_page(server, "udata/paged-collection-1.jsonld", 1)
    local_page(server, "udata/paged-collection-2.jsonld", 2)
    caplog.set_level(logging.WARNING, logger=LOGGER)
    listing = iter_pages(first, fetch, max_pages=1)
    assert len(listed(listing)) == 3
    assert listing.pages == 1 and not listing.complete and not listing.loop_cut
    assert "more than 1 pages" in caplog.text


def test_format_is_guessed_when_neither_header_nor_suffix_says(server):
    url = server.serve("/export?format=default", sample(DCAT_AP_DE[0]), "text/plain")
    listing = iter_pages(url, fetch)
    assert len(listed(listing)) == 2 and listing.complete


def test_broken_page_over_http_names_its_url(server):
    url = server.serve("/catalog.ttl?page=1", sample(BEE_TTL), "text/turtle")
    with pytest.raises(RdfParseError, match=r"/catalog\.ttl\?page=1"):
        listed(iter_pages(url, fetch))


def test_remote_jsonld_context_is_fetched_through_the_source(server):
    """The bee series (compact JSON-LD) with its remote context served locally; the context here is a
    minimal one written for the test (the real one is not among the samples)."""
    context = {"@context": {
        "dcat": "http://www.w3.org/ns/dcat#", "dct": "http://purl.org/dc/terms/",
        "example-ds": "http://example.test/dataset/", "example-ser": "http://example.test/series/",
        "Dataset": "dcat:Dataset", "DatasetSeries": "dcat:DatasetSeries",
        "title": {"@id": "dct:title", "@container": "@language"},
        "modificationDate": {"@id": "dct:modified", "@type": "http://www.w3.org/2001/XMLSchema#date"},
    }}
    context_url = server.serve("/context.jsonld", json.dumps(context).encode(), "application/json")
    page = sample(BEE_JSONLD).decode("utf-8").replace(BEE_CONTEXT, context_url)
    url = server.serve("/bee.jsonld", page.encode())
    listing = iter_pages(url, fetch)
    found = listed(listing)
    assert len(found) == 4 and all(r.ok for r in found)
    by_id = {r.source_id: r for r in found}
    bees_2022 = by_id["http://example.test/dataset/BeePopulation2022"]
    assert bees_2022.title == "Bee population 2022 in the region of Thessaloniki"
    assert bees_2022.metadata_modified == datetime(2022, 3, 20, tzinfo=timezone.utc)
    assert server.paths().count("/context.jsonld") == 1


def test_source_over_http_fetcher(server):
    url = server.serve("/catalog.rdf", sample("ckanext-dcatde/catalog-endpoint.rdf"), "application/rdf+xml")
    source = DcatRdfSource(url, fetcher=HttpFetcher(url, max_retries=0), language="de")
    listing = Listing()
    found = [r for page in source.iter_records(None, 100, listing) for r in page]
    assert len(found) == 6 and listing.complete and source.complete
    assert (source.pages, source.listed, source.total, source.requests_made) == (1, 6, 6, 1)
    assert "application/rdf+xml" in server.requests[0][1]["accept"]
    missing = DcatRdfSource(f"{server.base}/gone.rdf", fetcher=HttpFetcher(server.base, max_retries=0))
    with pytest.raises(SourceError, match=r"/gone\.rdf: HTTP 404"):
        list(missing.iter_pages())
