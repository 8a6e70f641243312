"""DCAT over SPARQL (harvester.sources.dcat_sparql) against the local SPARQL endpoint
(harvester.testing.sparql_portal: rdflib's SPARQL engine over real DCAT-AP catalogues, with
Virtuoso's limits): the recorded results file, records equal to the RDF documents', keyset paging
proved complete by an empty page, cut answers, the incremental filter, loops cut, untrusted IRIs,
faults retried, refused queries and hostile bodies."""
from __future__ import annotations

import json
import re
from datetime import datetime, timezone
from urllib.parse import urlencode

import pytest
import requests

from harvester.http import HttpFetcher, RetriesExhausted
from harvester.http.guard import FetchPolicy
from harvester.sources.base import FilterRejected, Listing, SourceError
from harvester.sources.dcat_rdf import records_from_graph
from harvester.sources.dcat_sparql import (DcatSparqlSource, details_query, iri_ref, listing_query, rows_of,
                                           string_literal, term)
from harvester.testing.samples import portal_sample
from harvester.testing.sparql_portal import (DCATDE, UNIBO, SparqlServer, dataset_iris, derived_catalogue,
                                             sample_catalogue, sample_graph)

from rdflib import Literal, URIRef
from rdflib import namespace as ns

DCAT, DCTERMS, RDF, XSD = ns.DCAT, ns.DCTERMS, ns.RDF, ns.XSD


def source(server, *, graph=None, language=None, max_retries=3, policy=None) -> DcatSparqlSource:
    fetcher = HttpFetcher(server.url, max_retries=max_retries, backoff=0.01, sleep=lambda s: None, policy=policy)
    return DcatSparqlSource(server.url, fetcher=fetcher, graph=graph, language=language)


def listed(src, since=None, page_size=100):
    listing = Listing()
    records = [r for page in src.iter_records(since, page_size, listing) for r in page]
    return records, listing


N = 240  # datasets of the derived catalogue


@pytest.fixture(scope="module")
def derived():
    return derived_catalogue(sample_graph(UNIBO), N)


@pytest.fixture(scope="module")
def expected(derived):
    """{IRI: metadata hash} of every derived dataset, read from an endpoint that cuts nothing."""
    with SparqlServer(derived) as whole:
        return {r.source_id: r.metadata_hash for r in listed(source(whole))[0]}


# -- the recorded answer and the query texts ---------------------------------------------------------
def test_the_recorded_results_file_reads_as_rdf_terms():
    answer = json.loads(portal_sample("dcat-sparql", "select-datasets-results-handmade-ceres.srj.json").read_text())
    first, second = rows_of(answer)
    assert term(first["dataset"]) == URIRef("https://data.europa.eu/dataset/1234")
    assert term(first["title"]) == Literal("Air Quality Data", lang="en")
    modified = term(first["modified"])  # the lexical form as written
    assert (str(modified), modified.datatype) == ("2026-06-30T12:00:00Z", XSD.dateTime)
    assert set(second) == {"dataset", "title"}  # unbound OPTIONAL variables are absent
    assert term({"type": "typed-literal", "value": "7", "datatype": str(XSD.integer)}) == Literal("7", datatype=XSD.integer)
    assert term({"type": "literal", "value": "x", "xml:lang": "not a tag!"}) == Literal("x")
    assert term({"type": "uri"}) is None and term(["uri"]) is None
    with pytest.raises(ValueError, match="not SPARQL JSON results"):
        rows_of({"head": {}, "boolean": True})


def test_queries_never_page_by_offset_and_escape_what_they_carry():
    query = listing_query(graph="https://g.org/catalogue", after='https://x.org/a"b\\c\nd', limit=500,
                          since=datetime(2024, 3, 2, 1, tzinfo=timezone.utc))
    assert "OFFSET" not in query and "ORDER BY STR(?dataset)\nLIMIT 500" in query
    assert 'FILTER(STR(?dataset) > "https://x.org/a\\"b\\\\c\\nd")' in query
    assert 'STR(?m) >= "2024-03-01"' in query and "GRAPH <https://g.org/catalogue> {" in query
    for bad in ("https://x.org/a> } ?s ?p ?o {", 'https://x.org/"', "https://x.org/a b", "https://x.org/\\u0041"):
        with pytest.raises(ValueError, match="cannot be written in a SPARQL query as an IRI"):
            iri_ref(bad)
    assert string_literal('a"b') == '"a\\"b"'
    assert "VALUES ?dataset { <https://x.org/1> <https://x.org/2> }" in details_query(
        ["https://x.org/1", "https://x.org/2"], graph=None)


# -- records ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", [UNIBO, DCATDE])
def test_a_dataset_read_over_sparql_is_the_record_its_rdf_document_gives(name):
    graph = sample_graph(name)
    direct = {r.source_id: r for r in records_from_graph(graph, "http://x", "it")}
    with SparqlServer(graph) as server:
        records, listing = listed(source(server, language="it"), page_size=5)
    assert listing.complete and {r.source_id for r in records} == set(direct) == set(dataset_iris(graph))
    for record in records:
        same = direct[record.source_id]
        assert (record.metadata_hash, record.content_hash, record.title) == (
            same.metadata_hash, same.content_hash, same.title)


def test_every_language_is_kept_the_title_shown_in_the_portals_and_the_record_says_which():
    iri = "https://dati.unibo.it/dataset/0824deeb-8e76-4281-9120-c2177d0b13ca"
    with SparqlServer(sample_graph(UNIBO)) as server:
        (italian,) = [r for r in listed(source(server, language="it"))[0] if r.source_id == iri]
        (english,) = [r for r in listed(source(server))[0] if r.source_id == iri]
    assert italian.raw["translations"]["title"] == {"en": "Financial Statements 2016",
                                                          "it": "Bilancio di esercizio 2016"}
    assert set(italian.raw["translations"]["description"]) == {"en", "it"}
    assert (italian.title, italian.language) == ("Bilancio di esercizio 2016", "it")
    assert (english.title, english.language) == ("Financial Statements 2016", "en")
    with SparqlServer(sample_graph(DCATDE)) as server:  # untagged German text: dct:language DEU says it
        records, _ = listed(source(server))
    assert {r.language for r in records} == {"de", None}
    assert [r.source_id for r in records if r.language is None] == [  # the three that declare no language
        "http://data.example-domain.de/dataset/0ee2fe79-fc37-400d-a8ca-4915b0295aec",
        "http://data.example-domain.de/dataset/63961baa-2fd0-40d4-9242-4a9640ff5f1e",
        "http://data.example-domain.de/dataset/b5882a57-d142-4930-9290-b12bbb6e3f0c"]


# -- keyset paging --------------------------------------------------------------------------------------
def test_a_keyset_listing_of_a_derived_catalogue_is_exact_and_proved_complete(derived):
    with SparqlServer(derived) as server:
        src = source(server)
        records, listing = listed(src, page_size=100)
        assert src.count() == N
    assert listing.complete and len(records) == len({r.source_id for r in records}) == N
    assert all(r.ok for r in records) and records[0].title.endswith(" 0")
    kinds = server.kinds_of_queries()
    assert kinds.count("listing") == 4 and kinds[-1] == "count"  # 100, 100, 40, then the empty page
    assert not any("OFFSET" in q for q in server.queries)
    assert max(len(r) for r in server.requests) <= 8_100  # details asked in urls of at most 8,000 bytes


def test_answers_cut_without_a_word_are_read_to_the_end(derived, expected):
    with SparqlServer(derived, result_cap=2_000) as server:  # ResultSetMaxRows 2,000, no X-SPARQL-MaxRows
        records, listing = listed(source(server), page_size=200)
    assert listing.complete and {r.source_id: r.metadata_hash for r in records} == expected  # every record whole
    kinds = server.kinds_of_queries()
    assert kinds.count("listing") == 3 and kinds.count("details") > 2 * N // 50  # details cut, the rest asked again
    with SparqlServer(sample_catalogue(), result_cap=7) as server:  # listing pages cut below the 10 asked
        src = source(server)
        pages = [len(page.ids) for page in src.list_ids(10)]
    assert pages == [7, 7, 4] and src.complete  # the empty page after them proved the end


def test_virtuosos_maxrows_header_changes_nothing(derived, expected):
    with SparqlServer(derived, result_cap=3_000, maxrows_header=True) as server:
        src = source(server)
        records, listing = listed(src, page_size=200)
    assert listing.complete and {r.source_id: r.metadata_hash for r in records} == expected
    assert src.row_cap == 3_000


def test_a_dataset_too_large_for_one_answer_is_its_own_failed_record():
    graph = sample_graph(UNIBO)
    big = URIRef("https://dati.unibo.it/dataset/8cbba6bd-1686-4828-b223-6f4dab477434")  # 15 distributions
    with SparqlServer(graph, result_cap=150) as server:
        records, listing = listed(source(server))
    (refused,) = [r for r in records if not r.ok]
    assert refused.source_id == str(big) and refused.problems[0].code == "record-too-large"
    assert "150 rows long, came without its end row" in refused.error and len(records) == 12 and listing.complete


def test_a_named_graph_is_read_alone():
    with SparqlServer(sample_graph(UNIBO), graph_name="https://g.org/unibo") as server:
        for triple in sample_graph(DCATDE):
            server.store.graph(URIRef("https://g.org/other")).add(triple)
        src = source(server, graph="https://g.org/unibo")
        records, listing = listed(src)
        assert src.count() == 12 and source(server).count() == 18  # the default graph: every graph
    assert listing.complete and {r.source_id for r in records} == set(dataset_iris(sample_graph(UNIBO)))
    assert all("GRAPH <https://g.org/unibo>" in q for q in server.queries[:-1])


# -- incremental --------------------------------------------------------------------------------------------
def test_an_incremental_listing_asks_only_what_changed(derived):
    with SparqlServer(derived) as server:
        server.edit("https://data.example.org/dataset/000007", modified="2025-05-02T10:00:00Z", title="Edited",
                    lang="en")
        server.edit("https://data.example.org/dataset/000200", modified="2025-05-03T00:00:00Z")
        src = source(server)
        records, listing = listed(src, since=datetime(2025, 5, 2, 9, tzinfo=timezone.utc))
    assert [r.source_id for r in records] == ["https://data.example.org/dataset/000007",
                                              "https://data.example.org/dataset/000200"]
    assert records[0].title == "Edited" and not listing.complete  # (an incremental is never complete)
    assert server.kinds_of_queries() == ["incremental", "details", "incremental"]


def test_an_endpoint_ignoring_the_modified_filter_is_detected(derived):
    with SparqlServer(derived) as server:
        server.ignore_modified_filter = True
        with pytest.raises(FilterRejected, match="ignored the modified filter: dataset 'https://data.example.org/"
                                                 "dataset/000000' was modified at 2024-01-01T00:00:00"):
            listed(source(server), since=datetime(2025, 1, 1, tzinfo=timezone.utc))


def test_a_refused_query_names_what_it_was_for_and_a_refused_filter_falls_back(derived):
    with SparqlServer(derived) as server:
        server.fail_next(1, status=400)
        with pytest.raises(FilterRejected, match=r"the incremental listing query to http://127.0.0.1:\d+/sparql was "
                                                 r"refused \(HTTP 400: Virtuoso 37000 Error SP030"):
            listed(source(server), since=datetime(2025, 1, 1, tzinfo=timezone.utc))
        server.fail_next(1, status=400)
        with pytest.raises(SourceError, match="the listing query .* was refused") as refused:
            listed(source(server))
        assert not isinstance(refused.value, FilterRejected)
        with pytest.raises(SourceError, match="is the portal's url a SPARQL endpoint"):
            DcatSparqlSource(server.base_url + "/nothing", fetcher=HttpFetcher(server.base_url)).count()


# -- loops and untrusted answers --------------------------------------------------------------------------------
def test_a_cursor_that_does_not_advance_cuts_the_listing_and_the_id_listing_refuses(derived, caplog):
    with SparqlServer(derived) as server:
        server.ignore_filter = True  # every page is the first one again
        src = source(server)
        records, listing = listed(src, page_size=100)
        assert (len(records), listing.complete, src.loop_cut) == (100, False, True)  # the first page, once
        assert "not past it" in caplog.text
        with pytest.raises(SourceError, match=r"identifier listing of .* was cut short \(2 pages read\)"):
            list(src.list_ids(100))
    assert sorted(server.kinds_of_queries()) == ["details", "details", "listing", "listing", "listing", "listing"]


def test_iris_that_could_end_a_query_are_never_written_into_one():
    graph = sample_graph(DCATDE)
    hostile = ['https://x.org/d> } ?s ?p ?o { <x', 'https://x.org/"quoted"', "https://x.org/back\\slash"]
    for i, iri in enumerate(hostile):
        node = URIRef(iri)
        graph.add((node, RDF.type, DCAT.Dataset))
        graph.add((node, DCTERMS.title, Literal(f"Hostile {i}")))
    with SparqlServer(graph) as server:
        src = source(server)
        records, listing = listed(src, page_size=2)  # hostile IRIs end pages: the cursor carries them
        ids = [i for page in src.list_ids(2) for i, _ in page.ids]
    assert listing.complete and len(records) == 9
    refused = {r.source_id: r for r in records if not r.ok}
    assert set(refused) == set(hostile) and {r.problems[0].code for r in refused.values()} == {"no-identifier"}
    assert set(ids) == set(dataset_iris(sample_graph(DCATDE)))
    assert not any("> } ?s ?p ?o" in q for q in server.queries if "VALUES" in q)


def test_transient_faults_are_retried_and_counted(derived):
    with SparqlServer(derived) as server:
        for fault in ({"status": 503}, {"status": 429, "retry_after": "0"}, {"truncate": True}, {"html": True},
                      {"partial": True}):
            server.fail_next(1, **fault)
        src = source(server, max_retries=5)
        records, listing = listed(src, page_size=200)
    assert listing.complete and len(records) == N
    assert src.requests_made == len(server.requests) == len(server.queries)
    assert len(server.queries) == 5 + server.kinds_of_queries().count("details") + 3


def test_faults_outliving_the_retries_say_what_came_last(derived):
    with SparqlServer(derived) as server:
        server.fail_next(3, partial=True)
        with pytest.raises(RetriesExhausted, match="listing query failed after 3 attempts .*X-SQL-State S1TAT"):
            listed(source(server, max_retries=2))


def test_hostile_bodies_are_refused_with_a_clear_error(derived):
    with SparqlServer(derived) as server:
        server.fail_next(1, deep=True)  # 100,000 levels of arrays where rows should be
        with pytest.raises(SourceError, match="row 0 of the answer is list, not an object"):
            listed(source(server))
        server.fail_next(1, endless=True)
        small = FetchPolicy(max_bytes=2_000_000, timeout=5)
        with pytest.raises(SourceError, match="larger than 2000000 bytes"):
            listed(source(server, policy=small, max_retries=0))


def test_an_endpoint_ignoring_limit_is_refused():
    graph = sample_graph(UNIBO)
    with SparqlServer(graph) as server:
        original = server.answer
        server.answer = lambda q: original(re.sub(r"\nLIMIT \d+$", "", q))
        with pytest.raises(SourceError, match="answered 12 rows, more than the 5 it asked for"):
            listed(source(server), page_size=5)


# -- the local endpoint is Virtuoso-like ------------------------------------------------------------------
def test_the_local_endpoint_refuses_deep_offsets_and_bad_queries_as_virtuoso_does():
    with SparqlServer(sample_catalogue()) as server:
        deep = "SELECT ?d WHERE { ?d ?p ?o } ORDER BY ?d LIMIT 1000 OFFSET 10000"
        answer = requests.get(server.url + "?" + urlencode({"query": deep}),
                              headers={"Accept": "application/sparql-results+json"}, timeout=10)
        assert answer.status_code == 500 and answer.text.startswith(
            "Virtuoso 22023 Error SR353: Sorted TOP clause specifies more then 11000 rows to sort. Only 10000 are "
            "allowed.")
        answer = requests.get(server.url + "?" + urlencode({"query": "SELEC ?x"}),
                              headers={"Accept": "application/sparql-results+json"}, timeout=10)
        assert answer.status_code == 400 and answer.text.startswith("Virtuoso 37000 Error SP030: SPARQL compiler")
        page = requests.get(server.url + "?" + urlencode({"query": "SELECT ?d WHERE { ?d ?p ?o } LIMIT 1"}),
                            timeout=10)
        assert page.headers["Content-Type"].startswith("text/html")  # no Accept: a page for people


def test_harvester_validate_reads_the_endpoints_first_pages(derived):
    from harvester.pipeline.validate import validate_url

    with SparqlServer(derived) as server:
        report = validate_url(server.url, "dcat-sparql", pages=2, page_size=50)
    assert (report.kind, report.records, report.failed, report.complete) == ("dcat-sparql", 100, 0, False)


def test_harvester_validate_reads_a_saved_answer_of_triples():
    import io

    from harvester.pipeline.validate import validate_file

    with SparqlServer(sample_graph(UNIBO)) as server:
        saved = requests.get(server.url + "?" + urlencode({"query": "SELECT ?s ?p ?o WHERE { ?s ?p ?o }"}),
                             headers={"Accept": "application/sparql-results+json"}, timeout=10).content
    report = validate_file(io.BytesIO(saved), "dcat-sparql", "answer.srj")
    assert (report.kind, report.records, report.failed, report.complete) == ("dcat-sparql", 12, 0, True)
    recorded = portal_sample("dcat-sparql", "select-datasets-results-handmade-ceres.srj.json").read_bytes()
    with pytest.raises(SourceError, match=r"read as the triples of its \?s \?p \?o rows; this one's first row binds "
                                          "dataset, description, identifier, modified, title"):
        validate_file(io.BytesIO(recorded), "dcat-sparql", "ceres.srj")
