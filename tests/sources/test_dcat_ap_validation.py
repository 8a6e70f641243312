"""DCAT-AP validation of the RDF source (sources/dcat_rdf.py, ``validate``): on every sample that
parses offline, the problems each dataset must have are worked out with plain rdflib triple lookups
(not the module's functions: harvester.testing.expected_outcomes) and compared with the records the
source yields; then one small Turtle document per rule, each showing its rule fire with the field
and the value."""
from __future__ import annotations

import logging
import os
import re
from collections import Counter
from pathlib import Path

import pytest
from rdflib import Graph, Literal, URIRef
from rdflib.namespace import DCAT, DCTERMS, RDF

from harvester.domain.outcomes import CODES, ERROR
from harvester.sources.dcat_rdf import parse_page, records_from_graph
from harvester.testing.expected_outcomes import RULE_CODES, expected_dataset

ROOT = Path(__file__).resolve().parents[2]
DCAT_SAMPLES = Path(os.environ.get("HARVESTER_DCAT_SAMPLES_DIR") or ROOT.parent / "shared" / "dcat-samples" / "dcat-ap")
# Every sample that parses offline (the two bee-population files do not: broken Turtle, remote context).
SAMPLES = [
    "udata/udata.xml", "udata/geonetwork.xml", "udata/series.xml",
    "udata/datara--5a26b0f6-0ccf-46ad-ac58-734054b91977.rdf.xml",
    "udata/paged-collection-1.jsonld", "udata/paged-collection-2.jsonld",
    "udata/partial-collection-1.jsonld", "udata/partial-collection-2.jsonld",
    "ckanext-dcat/dataset_gov_de.rdf", "ckanext-dcat/dataset_gob_es.ttl", "ckanext-dcatde/catalog-endpoint.rdf",
    "ckanext-dcatapit/catalog_dati_unibo.rdf", "ckanext-dcatapchharvest/catalog.xml",
    "ckanext-dcatapchharvest/dataset-datetimes-bad.xml", "dcat-ap-de/dcat_ap_de-RefImp_TTL_ADVANCED.ttl",
    "dcat-ap-de/dcat_ap_de-RefImp_RDF_ADVANCED.rdf", "dcat-ap-de/dcat_ap_de-RefImp_JSONLD_ADVANCED.jsonld",
    "semiceu-dcat-ap/example-ms_catalogue_hvd.ttl",
]

@pytest.fixture(autouse=True)
def quiet_rdflib():
    """rdflib logs a traceback for every literal that does not fit its datatype."""
    logging.getLogger("rdflib").setLevel(logging.CRITICAL)
    yield
    logging.getLogger("rdflib").setLevel(logging.NOTSET)


def load(name: str) -> tuple[Graph, str]:
    path = DCAT_SAMPLES / name
    if not path.exists():
        pytest.fail(f"sample file {path} is missing (tests read ../shared/dcat-samples/dcat-ap)")
    url = f"http://samples.test/{name}"
    return parse_page(path.read_bytes(), None, url), url


# -- the expectations, worked out independently (harvester.testing.expected_outcomes) ------------
def actual(record) -> Counter:
    out = Counter()
    for p in record.problems:
        if p.code in RULE_CODES:
            field = "*" if p.code == "bad-optional-date" else re.sub(r"\[\d+\]", "[_]", p.field or "")
            out[(p.code, field or None, p.value)] += 1
    return out


def source_records(graph: Graph, url: str):
    return records_from_graph(graph, url, None)


@pytest.mark.parametrize("name", SAMPLES)
def test_sample_records_fail_and_warn_as_the_rules_say(name):
    graph, url = load(name)
    nodes = set(graph.subjects(RDF.type, DCAT.Dataset))
    found = source_records(graph, url)
    assert len(found) == len(nodes)
    by_id = {r.source_id: r for r in found if r.source_id is not None}
    assert len(by_id) == len([r for r in found if r.source_id is not None])
    nameless_want, nameless_got = [], sorted((actual(r) for r in found if r.source_id is None), key=repr)
    for d in nodes:
        ident, ok, problems = expected_dataset(graph, d)
        if ident is None:  # no identity or no title: failed without an id
            nameless_want.append(problems)
            continue
        record = by_id[ident] if ident != "landing" else next(r for r in found if r.source_id.startswith("landing:"))
        assert record.ok == ok, (name, ident, record.problems)
        assert actual(record) == problems, (name, ident)
    assert sorted(nameless_want, key=repr) == nameless_got
    assert all(p.code in CODES and p.message for r in found for p in r.problems)
    for record in found:
        if not record.ok:  # a Failed record carries its errors only, and says them in ``error``
            assert record.problems and all(p.severity == ERROR for p in record.problems)
            assert all(p.message in record.error for p in record.problems)


def test_every_message_names_its_field_and_value():
    for name in SAMPLES:
        graph, url = load(name)
        for record in source_records(graph, url):
            for p in record.problems:
                ruled = p.code in RULE_CODES - {"no-identifier", "no-title"}
                if ruled and p.field and p.field.startswith(("dct", "dcat")):
                    assert p.field.split(".")[-1].split("[")[0] in p.message
                    if p.value:
                        assert p.value[:50] in p.message


def test_description_stays_a_warning_as_the_samples_ask():
    """The documented choice: a dataset without dct:description is stored (no-description), since
    the samples' real portal records without one (opendata.swiss) are what Harvester must keep."""
    titled = missing = 0
    for name in SAMPLES:
        graph, url = load(name)
        records = {r.source_id: r for r in source_records(graph, url)}
        for d in set(graph.subjects(RDF.type, DCAT.Dataset)):
            if not any(isinstance(o, Literal) for o in graph.objects(d, DCTERMS.title)):
                continue
            titled += 1
            if (d, DCTERMS.description, None) not in graph:
                missing += 1
        for record in records.values():  # a missing description is never among a record's errors
            assert all(p.field != "dct:description" for p in record.problems if p.severity == "error")
    assert (titled, missing) == (42, 3)
    graph, url = load("ckanext-dcatapchharvest/catalog.xml")
    found = source_records(graph, url)
    assert all(r.ok and "no-description" in {p.code for p in r.problems} for r in found)


def test_geonetwork_distributions_are_not_described():
    graph, url = load("udata/geonetwork.xml")
    [record] = source_records(graph, url)
    assert record.ok
    dists = sorted(str(o) for o in graph.objects(None, DCAT.distribution))
    assert len(dists) == 4
    incomplete = sorted(p.field for p in record.problems if p.code == "distribution-incomplete")
    assert incomplete == [f"dcat:distribution[{d}].dcat:accessURL" for d in dists]


def test_datetimes_bad_fails_without_title_and_is_read_with_one():
    graph, url = load("ckanext-dcatapchharvest/dataset-datetimes-bad.xml")
    [record] = source_records(graph, url)
    assert not record.ok and [(p.code, p.field) for p in record.problems] == [("no-title", "dct:title")]
    assert "no dct:title" in record.error
    node = URIRef("https://swisstopo/123")
    graph.add((node, DCTERMS.title, Literal("Datums-Test")))
    [record] = source_records(graph, url)
    assert record.ok  # its own dct:modified / dct:issued are dates; the bad ones are in dct:temporal
    assert {(p.code, p.field) for p in record.problems if p.code in RULE_CODES} == {
        ("recommended-missing", "dct:publisher"), ("recommended-missing", "dcat:contactPoint")}


def test_blank_node_distribution_labels_are_the_same_at_every_parse():
    first = [r.problems for r in source_records(*load("ckanext-dcatapchharvest/catalog.xml"))]
    second = [r.problems for r in source_records(*load("ckanext-dcatapchharvest/catalog.xml"))]
    assert first == second
    fields = {p.field for ps in first for p in ps}
    assert {"dcat:distribution[0].dcat:accessURL", "dcat:distribution[2].dcat:accessURL"} <= fields


# -- one rule, one document ------------------------------------------------------------------------
PREFIXES = """@prefix dcat: <http://www.w3.org/ns/dcat#> . @prefix dct: <http://purl.org/dc/terms/> .
@prefix foaf: <http://xmlns.com/foaf/0.1/> . @prefix xsd: <http://www.w3.org/2001/XMLSchema#> .
@prefix vcard: <http://www.w3.org/2006/vcard/ns#> .
"""
GOOD = {
    "dct:title": '"Water quality"@en',
    "dct:description": '"Samples of river water"@en',
    "dct:modified": '"2024-03-01T10:00:00Z"^^xsd:dateTime',
    "dct:issued": '"2020-01-01"^^xsd:date',
    "dct:publisher": "<http://org.test/agency>",
    "dcat:contactPoint": '[ a vcard:Kind ; vcard:fn "Desk" ]',
    "dcat:distribution": "<http://c.test/dist/1>",
    "dcat:landingPage": "<http://c.test/page/1>",
    "dcat:keyword": '"water"@en',
    "dcat:theme": "<http://publications.europa.eu/resource/authority/data-theme/ENVI>",
    "dct:license": "<http://creativecommons.org/licenses/by/4.0/>",
}
DATASET = URIRef("http://c.test/dataset/1")


def document(subject: str = "<http://c.test/dataset/1>", dist: str = "<http://c.test/dist/1> dcat:accessURL "
             "<http://c.test/file.csv> .", extra: str = "", **changes: str | None) -> Graph:
    props = {**GOOD, **{k.replace("__", ":"): v for k, v in changes.items()}}
    body = " ;\n  ".join(f"{k} {v}" for k, v in props.items() if v is not None)
    text = f"{PREFIXES}{subject} a dcat:Dataset ;\n  {body} .\n{dist}\n{extra}"
    graph = Graph()
    graph.parse(data=text, format="turtle")
    return graph


def one(graph: Graph):
    [record] = records_from_graph(graph, "http://c.test/catalog.ttl", None)
    return record


def rule_problems(record) -> set[tuple]:
    return {(p.code, p.field, p.value) for p in record.problems if p.code in RULE_CODES}


def test_a_conforming_dataset_has_no_rule_problems():
    record = one(document())
    assert record.ok and rule_problems(record) == set()


CASES = [
    # (changes, stored?, the problem that must be there)
    (dict(dct__modified='"2021-13-45"^^xsd:date'), False, ("bad-range", "dct:modified", "2021-13-45")),
    (dict(dct__modified='"last week"'), False, ("bad-range", "dct:modified", "last week")),
    (dict(dct__modified="<http://c.test/some-date>"), False, ("bad-range", "dct:modified", "http://c.test/some-date")),
    (dict(dct__modified='""^^xsd:date'), True, ("range-tolerated", "dct:modified", "")),
    (dict(dct__issued='"2020-02-30"^^xsd:date'), True, ("bad-optional-date", "issued", "2020-02-30")),
    (dict(dct__issued='"2020-02-30"^^xsd:date, "soon"'), True, ("bad-optional-date", "dct:issued", "soon")),
    (dict(dcat__distribution='"a CSV file"'), False, ("bad-range", "dcat:distribution", "a CSV file")),
    (dict(dct__publisher='"Agency"'), False, ("bad-range", "dct:publisher", "Agency")),
    (dict(dcat__contactPoint='"desk@agency.test"'), False, ("bad-range", "dcat:contactPoint", "desk@agency.test")),
    (dict(dcat__landingPage='"http://c.test/page/1"'), True, ("range-tolerated", "dcat:landingPage",
                                                              "http://c.test/page/1")),
    (dict(dcat__theme='"Environment"'), True, ("range-tolerated", "dcat:theme", "Environment")),
    (dict(dcat__keyword="<http://c.test/kw/water>"), True, ("range-tolerated", "dcat:keyword",
                                                            "http://c.test/kw/water")),
    (dict(dct__publisher=None), True, ("recommended-missing", "dct:publisher", None)),
    (dict(dcat__contactPoint=None), True, ("recommended-missing", "dcat:contactPoint", None)),
]


@pytest.mark.parametrize("changes, stored, wanted", CASES, ids=[f"{c[2][0]}:{c[2][1]}:{c[2][2]}" for c in CASES])
def test_each_rule_fires_with_its_field_and_value(changes, stored, wanted):
    record = one(document(**changes))
    assert record.ok is stored
    assert wanted in {(p.code, p.field, p.value) for p in record.problems}
    found = next(p for p in record.problems if (p.code, p.field, p.value) == wanted)
    assert found.field.split(":")[-1] in found.message or wanted[1] == "issued"
    if wanted[2]:
        assert wanted[2] in found.message
    if not stored:
        assert record.source_id == str(DATASET) and found.message in record.error


def test_distribution_without_access_url_is_a_warning_of_the_stored_dataset():
    record = one(document(dist="<http://c.test/dist/1> dcat:downloadURL <http://c.test/file.csv> ."))
    assert record.ok
    field = "dcat:distribution[http://c.test/dist/1].dcat:accessURL"
    assert ("distribution-incomplete", field, None) in rule_problems(record)
    assert CODES["distribution-incomplete"].severity == "warning"


def test_access_url_written_as_a_literal_is_tolerated():
    record = one(document(dist='<http://c.test/dist/1> dcat:accessURL "http://c.test/file.csv" .'))
    assert record.ok
    assert ("range-tolerated", "dcat:distribution[http://c.test/dist/1].dcat:accessURL",
            "http://c.test/file.csv") in rule_problems(record)


def test_catalogue_record_modified_is_checked_when_the_dataset_has_none():
    record = one(document(dct__modified=None, extra=(
        '<http://c.test/record/1> a dcat:CatalogRecord ; foaf:primaryTopic <http://c.test/dataset/1> ; '
        'dct:modified "never" .')))
    assert not record.ok
    assert rule_problems(record) == {("bad-range", "dcat:CatalogRecord.dct:modified", "never")}


def test_missing_title_and_identity_keep_their_messages():
    record = one(document(dct__title=None))
    assert not record.ok and record.error == "dataset 'http://c.test/dataset/1' has no dct:title"
    assert rule_problems(record) == {("no-title", "dct:title", None)}
    record = one(document(subject="[]", dcat__landingPage=None))
    assert not record.ok and record.source_id is None
    assert "has no IRI, dct:identifier or dcat:landingPage" in record.error and "Water quality" in record.error
    assert rule_problems(record) == {("no-identifier", "dct:identifier", None)}


def test_missing_description_is_stored_with_the_content_warning():
    record = one(document(dct__description=None))
    assert record.ok
    assert "no-description" in {p.code for p in record.problems}
    assert not [p for p in record.problems if p.severity == "error"]


def test_several_errors_are_all_said():
    record = one(document(dct__publisher='"Agency"', dct__modified='"yesterday"'))
    assert not record.ok
    assert {(p.code, p.field) for p in record.problems} == {("bad-range", "dct:publisher"),
                                                           ("bad-range", "dct:modified")}
    assert "'Agency'" in record.error and "'yesterday'" in record.error


# -- the other kinds' failed records carry coded problems (their messages as before) ---------------
def _coded(record) -> list[tuple[str, str | None]]:
    assert not record.ok and all(p.message in record.error for p in record.problems)
    return [(p.code, p.field) for p in record.problems]


def test_other_kinds_code_their_failed_records():
    import xml.etree.ElementTree as ET

    from harvester.sources import arcgis_hub, csw, opendatasoft, socrata

    rec = socrata.normalize({"resource": {"id": "abcd-1234"}}, "https://data.city.test/api/catalog/v1")
    assert _coded(rec) == [("no-title", "resource.name")] and "no name" in rec.error
    rec = socrata.normalize({"resource": {"name": "Trees"}}, "https://data.city.test/api/catalog/v1")
    assert _coded(rec) == [("no-identifier", "resource.id")] and "'Trees' has no resource.id" in rec.error
    assert _coded(socrata.normalize({"x": 1}, "https://d.test/api"))[0][0] == "not-an-object"
    assert _coded(socrata.normalize(["not", "a", "dict"], "https://d.test/api"))[0][0] == "not-an-object"

    rec = opendatasoft.normalize({"dataset_id": "zz-untitled", "metas": {"default": {}}}, "https://ods.test")
    assert _coded(rec) == [("no-title", "metas.default.title")] and "'zz-untitled' has no title" in rec.error
    assert _coded(opendatasoft.normalize({"metas": {}}, "https://ods.test")) == [("no-identifier", "dataset_id")]
    assert _coded(opendatasoft.normalize("text", "https://ods.test"))[0][0] == "not-an-object"

    rec = arcgis_hub.normalize({"id": "f4bcc", "properties": {}}, "https://hub.test")
    assert _coded(rec) == [("no-title", "properties.title")] and rec.error == "https://hub.test: item 'f4bcc': no title"
    assert _coded(arcgis_hub.normalize({"properties": {}}, "https://hub.test"))[0][0] == "no-identifier"
    assert _coded(arcgis_hub.normalize({"id": "x"}, "https://hub.test"))[0][0] == "not-an-object"
    assert _coded(arcgis_hub.normalize(7, "https://hub.test"))[0][0] == "not-an-object"

    dc = "http://purl.org/dc/elements/1.1/"
    untitled = ET.fromstring(f'<r xmlns:dc="{dc}"><dc:identifier>rec-1</dc:identifier></r>')
    assert _coded(csw.dc_record(untitled, lambda i: i)) == [("no-title", "dc:title")]
    anonymous = ET.fromstring(f'<r xmlns:dc="{dc}"><dc:title>Roads</dc:title></r>')
    rec = csw.dc_record(anonymous, lambda i: i)
    assert _coded(rec) == [("no-identifier", "dc:identifier")] and "'Roads' has no dc:identifier" in rec.error


def test_the_kinds_of_issue_39_code_their_failed_records():
    """udata, STAC, OAI-PMH, SDMX and a WAF's ISO files: each refusal carries its code and field
    (dcat-sparql's records are dcat_rdf's mapping, checked above)."""
    import xml.etree.ElementTree as ET

    from harvester.sources import iso_waf, oai_pmh, sdmx, stac, udata

    api = "https://www.data.gouv.fr/api/1"
    rec = udata.normalize({"id": "5e2f0b7a8b4c41d7f4d3e2a1"}, api)
    assert _coded(rec) == [("no-title", "title")] and "5e2f0b7a8b4c41d7f4d3e2a1" in rec.error
    assert _coded(udata.normalize({"title": "Trees"}, api)) == [("no-identifier", "id")]
    assert _coded(udata.normalize({"id": "a", "title": "T", "last_modified": "soon"}, api)) == [
        ("bad-date", "last_modified")]
    assert _coded(udata.normalize({"id": "a", "title": "T", "description": {"fr": "x"}}, api)) == [
        ("wrong-type", "description")]
    assert _coded(udata.normalize(["a"], api))[0][0] == "not-an-object"

    base = "https://stac.example.org/"
    assert _coded(stac.normalize({"type": "Collection", "title": "No id"}, base, base))[0] == ("no-identifier", "id")
    assert _coded(stac.normalize({"type": "Collection", "id": "c", "title": 7}, base, base)) == [("wrong-type", "title")]
    assert _coded(stac.normalize("text", base, base))[0][0] == "not-an-object"

    oai, dc = oai_pmh.NS["oai"], "http://purl.org/dc/elements/1.1/"

    def record(header: str, metadata: str = "") -> ET.Element:
        return oai_pmh.parse_xml(f'<record xmlns="{oai}">{header}{metadata}</record>'.encode())

    url = lambda i: f"https://repo.test/oai?id={i}"  # noqa: E731
    dc_meta = (f'<metadata><oai_dc:dc xmlns:oai_dc="{oai_pmh.NS["oai_dc"]}" xmlns:dc="{dc}">{{}}</oai_dc:dc>'
               "</metadata>")
    good_header = "<header><identifier>oai:r:1</identifier><datestamp>2024-01-01</datestamp></header>"
    assert _coded(oai_pmh.record_of(record(""), url)) == [("no-identifier", "header")]
    assert _coded(oai_pmh.record_of(record("<header><identifier>  </identifier></header>"), url)) == [
        ("no-identifier", "header/identifier")]
    assert _coded(oai_pmh.record_of(record("<header><identifier>oai:r:1</identifier><datestamp>soon</datestamp>"
                                           "</header>"), url)) == [("bad-date", "header/datestamp")]
    assert _coded(oai_pmh.record_of(record(good_header, dc_meta.format("<dc:creator>A</dc:creator>")), url)) == [
        ("no-title", "metadata/title")]
    assert _coded(oai_pmh.record_of(record(good_header, "<metadata><mods/></metadata>"), url)) == [
        ("invalid-record", "metadata")]

    assert _coded(sdmx.dataflow_record({"agencyID": "FR1"}, None, service=None, language=None)) == [
        ("no-identifier", "@id")]
    assert _coded(sdmx.dataflow_record({"agencyID": "FR1", "id": "BIG"}, None, service=None, language=None)) == [
        ("record-too-large", None)]

    gmd = "http://www.isotc211.org/2005/gmd"
    untitled = ET.fromstring(f'<gmd:MD_Metadata xmlns:gmd="{gmd}"/>')
    rec = iso_waf.waf_record(untitled, iso_waf.WafFile("https://waf.test/a.xml"))
    assert _coded(rec) == [("no-title", "gmd:identificationInfo/*/gmd:citation/*/gmd:title")]
    for body, code in ((b"<html><body>Not found</body></html>", "not-iso-metadata"),
                       (b'<!DOCTYPE x [<!ENTITY e "e">]><x/>', "unsafe-xml")):
        with pytest.raises(iso_waf.Refused) as refused:
            iso_waf.read_iso(body)
        assert refused.value.code == code
