"""What every source must say alike: the DCAT data.json and DCAT-AP RDF sources name the same
publisher as the same organization, and every source (and the local CKAN server) reads the same
timestamp as the same instant."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from rdflib import BNode, Graph, Literal, URIRef
from rdflib import namespace as ns

from harvester.domain.dataset import parse_timestamp, slug
from harvester.sources import dcat_json
from harvester.sources.ckan import parse_ckan_timestamp
from harvester.sources.dcat_rdf import parse_page, records_from_graph
from harvester.sources import dcat_sparql, iso_waf, oai_pmh, sdmx, stac, udata
from harvester.testing.ckan_portal import record_ms

CATALOG = "https://catalog.example.org/catalog"
DATASET = "https://catalog.example.org/dataset/1"


def json_package(publisher: str | None = None, modified: str | None = None) -> dict:
    entry = {"identifier": DATASET, "title": "Air quality", "landingPage": DATASET}
    if publisher is not None:
        entry["publisher"] = {"name": publisher}
    if modified is not None:
        entry["modified"] = modified
    record = dcat_json.normalize(entry, CATALOG + "/data.json")
    assert record.ok, record.error
    return record


def rdf_package(publisher: str | None = None, modified: str | None = None, *, ok: bool = True):
    """The same dataset in a Turtle page, read back through the source's parser."""
    graph, dataset = Graph(), URIRef(DATASET)
    graph.add((dataset, ns.RDF.type, ns.DCAT.Dataset))
    graph.add((dataset, ns.DCTERMS.title, Literal("Air quality")))
    graph.add((dataset, ns.DCAT.landingPage, URIRef(DATASET)))
    if publisher is not None:
        agent = BNode()
        graph.add((dataset, ns.DCTERMS.publisher, agent))
        graph.add((agent, ns.FOAF.name, Literal(publisher)))
    if modified is not None:
        graph.add((dataset, ns.DCTERMS.modified, Literal(modified)))
    page = parse_page(graph.serialize(format="turtle").encode(), "text/turtle", CATALOG + ".ttl")
    [record] = records_from_graph(page, CATALOG + ".ttl", None)
    assert record.ok == ok, record.error
    return record


def udata_package(modified: str):
    return udata.normalize({"id": "5e2f0b7a8b4c41d7f4d3e2a1", "title": "Air quality", "last_modified": modified,
                            "page": DATASET}, "https://www.data.gouv.fr/api/1")


def stac_package(updated: str):
    collection = {"type": "Collection", "stac_version": "1.0.0", "id": "air-quality", "title": "Air quality",
                  "description": "Air quality", "license": "CC-BY-4.0", "updated": updated,
                  "extent": {"spatial": {"bbox": [[-180, -90, 180, 90]]}, "temporal": {"interval": [[None, None]]}},
                  "links": []}
    return stac.normalize(collection, "https://stac.example.org/", "https://stac.example.org/collections/air-quality")


def oai_record(datestamp: str):
    xml = (f'<record xmlns="{oai_pmh.NS["oai"]}"><header><identifier>oai:example.org:1</identifier>'
           f'<datestamp>{datestamp}</datestamp></header><metadata>'
           f'<oai_dc:dc xmlns:oai_dc="{oai_pmh.NS["oai_dc"]}" xmlns:dc="http://purl.org/dc/elements/1.1/">'
           '<dc:title>Air quality</dc:title><dc:identifier>https://example.org/record/1</dc:identifier>'
           '</oai_dc:dc></metadata></record>')
    return oai_pmh.record_of(oai_pmh.parse_xml(xml.encode()), lambda ident: "https://example.org/oai?id=" + ident)


def sparql_package(modified: str):
    def row(p: str, o: dict) -> dict:
        return {"s": {"type": "uri", "value": DATASET}, "p": {"type": "uri", "value": p}, "o": o}

    rows = [row(str(ns.RDF.type), {"type": "uri", "value": str(ns.DCAT.Dataset)}),
            row(str(ns.DCTERMS.title), {"type": "literal", "value": "Air quality"}),
            row(str(ns.DCAT.landingPage), {"type": "uri", "value": DATASET}),
            row(str(ns.DCTERMS.modified), {"type": "literal", "value": modified})]
    graph, unusable = dcat_sparql.graph_of(rows)
    assert unusable == 0
    [record] = dcat_sparql.records_of(graph, [DATASET], "https://sparql.example.org/sparql", None)
    return record


@pytest.mark.parametrize("publisher, name", [
    ("Behörde für Umwelt und Energie (BUE)", "behorde-fur-umwelt-und-energie-bue"),  # accents, punctuation
    ("  Ville   de Montréal\n", "ville-de-montreal"),  # spaces
    ("Ministère de l'Économie, des Finances & de la Relance", "ministere-de-l-economie-des-finances-de-la-relance"),
    ("Agència Catalana de l'Aigua — ACA", "agencia-catalana-de-l-aigua-aca"),
    ("東京都", None),  # nothing that folds to ASCII: named by its hash
    (" 東京都 ", None),
    ("x" * 99 + "-" + "y" * 20, "x" * 99),  # cut at 100 characters, no dash left at the end
])
def test_both_dcat_sources_name_a_publisher_alike(publisher, name):
    from_json, from_rdf = json_package(publisher).raw["organization"], rdf_package(publisher).raw["organization"]
    assert from_json["name"] == from_rdf["name"] == slug(publisher)
    if name is not None:
        assert from_json["name"] == name
    else:
        assert from_json["name"] == slug("東京都") and from_json["name"].startswith("org-")


@pytest.mark.parametrize("publisher", ["", "   ", None])
def test_neither_dcat_source_makes_an_organization_of_an_empty_name(publisher):
    assert json_package(publisher).raw.get("organization") is None
    assert rdf_package(publisher).raw.get("organization") is None
    assert json_package(publisher).organization is None and rdf_package(publisher).organization is None


@pytest.mark.parametrize("written, instant", [
    ("2013-06-17T15:32:05.305546", datetime(2013, 6, 17, 15, 32, 5, 305546, tzinfo=timezone.utc)),
    ("2019-09-30 22:00:00", datetime(2019, 9, 30, 22, tzinfo=timezone.utc)),
    ("2020-01-01T02:00:00+02:00", datetime(2020, 1, 1, tzinfo=timezone.utc)),
    ("2020-01-01T00:00:00Z", datetime(2020, 1, 1, tzinfo=timezone.utc)),
    ("2020-01-01", datetime(2020, 1, 1, tzinfo=timezone.utc)),
    ("2020-01-01T01:00:00+0100", datetime(2020, 1, 1, tzinfo=timezone.utc)),  # SDMX's offset without a colon
    ("9999-12-31T23:00:00-02:00", None),  # a date in its zone, past the calendar in UTC (raised OverflowError)
    ("soon", None),
])
def test_every_source_reads_a_timestamp_as_the_same_instant(written, instant):
    assert parse_timestamp(written) == instant
    assert parse_ckan_timestamp(written) == instant
    assert json_package(modified=written).metadata_modified == instant
    if instant is None:
        # A modification date that is not a date: DCAT-AP's range of dct:modified (and CKAN's own
        # check) fail the record; a data.json that names no schema keeps it, undated.
        failed = rdf_package(modified=written, ok=False)
        assert [(p.code, p.field, p.value) for p in failed.problems] == [("bad-range", "dct:modified", written)]
    else:
        assert rdf_package(modified=written).metadata_modified == instant
    # The local CKAN server: epoch milliseconds, as Solr keeps dates.
    epoch = datetime(1970, 1, 1, tzinfo=timezone.utc)
    assert record_ms(written) == (None if instant is None else (instant - epoch) // timedelta(milliseconds=1))
    # The kinds of issue 39 (each through parse_timestamp: no zone is UTC, an offset converted).
    # udata: last_modified (udata writes UTC without a zone); one that is not a date fails the record.
    from_udata = udata_package(written)
    if instant is None:
        assert [(p.code, p.field) for p in from_udata.problems] == [("bad-date", "last_modified")]
    else:
        assert from_udata.metadata_modified == instant
    # STAC: a collection's updated; one that is not a date is dropped with its warning, the record kept.
    from_stac = stac_package(written)
    assert from_stac.ok and from_stac.metadata_modified == instant
    assert [(p.code, p.field) for p in from_stac.problems if p.code == "bad-optional-date"] == (
        [] if instant is not None else [("bad-optional-date", "updated")])
    # SDMX: an UPDATE_DATA annotation (INSEE's, ECB's: +0100, +01:00, Z); unreadable: warned, undated.
    when, warned = sdmx._modified([{"type": "UPDATE_DATA", "title": written}], "FR1:FLOW(1.0)")
    assert (None if when is None else datetime.fromisoformat(when)) == instant
    assert [p.code for p in warned] == ([] if instant is not None else ["bad-optional-date"])
    # OAI-PMH: the header's datestamp; one that is not a date fails the record.
    from_oai = oai_record(written)
    if instant is None:
        assert [(p.code, p.field) for p in from_oai.problems] == [("bad-date", "header/datestamp")]
    else:
        assert from_oai.metadata_modified == instant
    # DCAT over SPARQL: dct:modified of a SPARQL JSON binding, mapped as the RDF source maps it.
    from_sparql = sparql_package(written)
    if instant is None:
        assert [(p.code, p.field, p.value) for p in from_sparql.problems] == [("bad-range", "dct:modified", written)]
    else:
        assert from_sparql.metadata_modified == instant


@pytest.mark.parametrize("line, instant", [
    # Apache (after the link), nginx (after), IIS short and long (before): no zone given, read as UTC
    ('<a href="a.xml">a.xml</a>            2020-01-01 00:00  4.1K', datetime(2020, 1, 1, tzinfo=timezone.utc)),
    ('<a href="a.xml">a.xml</a>   01-Jan-2020 00:00    4182', datetime(2020, 1, 1, tzinfo=timezone.utc)),
    ('1/1/2020 12:00 AM        4182 <a href="a.xml">a.xml</a>', datetime(2020, 1, 1, tzinfo=timezone.utc)),
    ('Wednesday, January 1, 2020 12:00 AM        4182 <a href="a.xml">a.xml</a>',
     datetime(2020, 1, 1, tzinfo=timezone.utc)),
    ('<a href="a.xml">a.xml</a>   31-Feb-2020 00:00    4182', None),  # no such day: undated
])
def test_a_waf_listing_date_is_read_as_utc_whatever_the_server(line, instant):
    """A WAF listing gives the server's local time with no zone: like CKAN's dates without a zone,
    it is taken as UTC (sources/iso_waf.py WafFile.modified_utc), whichever server wrote it."""
    page = iso_waf.parse_listing(f"<html><body><pre>{line}</pre></body></html>", "https://waf.example.org/",
                                 "https://waf.example.org/")
    [file] = page.files
    assert file.url == "https://waf.example.org/a.xml" and file.modified_utc == instant
