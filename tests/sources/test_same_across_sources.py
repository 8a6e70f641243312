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
