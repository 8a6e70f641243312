"""DCAT datasets read from a SPARQL endpoint (``dcat-sparql``): data.europa.eu and other
piveau / Virtuoso catalogues.

The portal's url is the endpoint (``https://data.europa.eu/sparql``); ``graph:`` in portals.yaml
names the graph its datasets are in (none: the endpoint's default graph). Every query is a GET of
``<url>?query=<SPARQL>`` with ``Accept: application/sparql-results+json`` (the SPARQL 1.1 Protocol;
a query already in the url, e.g. ``default-graph-uri=``, is kept), and every answer is read as
SPARQL 1.1 Query Results JSON. The query texts are the functions ``listing_query``,
``details_query`` and ``count_query`` below (the docs show them).

- **Listing, by keyset**: one row per dataset IRI with its modification date, in IRI order, after
  the last IRI of the page before (``FILTER(STR(?dataset) > "<last>") ... ORDER BY STR(?dataset)
  LIMIT n``). Never OFFSET: Virtuoso refuses an ORDER BY whose OFFSET + LIMIT passes its
  MaxSortedTopRows (10,000 by default: ``Virtuoso 22023 Error SR353: Sorted TOP clause specifies
  more then 11000 rows to sort``). The date is the dataset's ``dct:modified``, else its catalogue
  record's (``foaf:primaryTopic``), the latest when several (what the record's metadata_modified
  is read from, so reconciliation compares like with like).
- **Complete** only on the endpoint's own proof: a page with no row after a cursor that moved
  forward. A short page is no proof (Virtuoso cuts every answer at ResultSetMaxRows without an
  error, and a proxy may cut it lower); keyset paging goes on past a cut page without losing a row.
  A page whose first IRI is not past the cursor, or whose IRIs are not in order (an endpoint that
  ignores the FILTER, or orders otherwise), cuts the listing with a warning: not complete, so
  nothing is removed, and an identifier listing so cut raises ``SourceError``.
- **Details**: the datasets of a page are described by a second query, ``VALUES ?dataset { <a>
  <b> }``: every triple about each dataset, about the nodes it points to (its distributions,
  publisher, contact point, and blank nodes two levels down) and about its catalogue record.
  The rows (``?s ?p ?o``) are read back into an rdflib graph and mapped by dcat_rdf's DCAT-AP
  mapping and rules (``record_from_node``): a dataset read over SPARQL is the record the same
  dataset gives in an RDF document, every language of its title, description and keywords kept
  in ``translations``, the shown title in the portal's ``language`` (else English, else untagged).
  The record's ``language`` is that title's language tag, else the dataset's ``dct:language``.
  A details query asks ``LIMIT 10000`` rows in dataset order (``ORDER BY STR(?dataset) ?end``)
  for as many datasets as fit a URL of 8,000 bytes (at most 50), each dataset's rows ended by a
  row with ``?end`` bound. Virtuoso cuts an answer at ResultSetMaxRows without an error (at most
  an ``X-SPARQL-MaxRows`` header, which proxies drop), so only a dataset whose end row came is
  read; those after the last one that came whole are asked again, and a dataset alone too large
  for one answer is a failed record (``record-too-large``).
- **Incremental**: the listing keeps the datasets whose date, as written, is on or after the day
  before ``since`` (``FILTER(STR(?m) >= "YYYY-MM-DD")``: a comparison every engine does the same
  way, whatever the datatype, time zone or its absence; at most a day too many, which the hashes
  find unchanged). Datasets without a date are not in an incremental listing: reconciliation
  (``list_ids``) finds them. A listed dataset dated more than a day before ``since`` means the
  endpoint ignored the filter: ``FilterRejected``; a 400 to the filtered query refused it.
- **Count**: ``SELECT (COUNT(DISTINCT ?dataset) AS ?n)``: exact.
- **Untrusted answers**: an IRI goes into a query only as ``<iri>`` when it has none of the
  characters IRIREF forbids (``<>"{}|^`\\``, spaces, controls), a cursor only as an escaped string
  literal; a dataset IRI that cannot be written so is a failed record (``no-identifier``), never
  asked for. A non-JSON answer, or one that is not SPARQL results, is retried (a proxy's page);
  an answer with more rows than asked (the LIMIT ignored) or a row that is not an object is an
  error; Virtuoso's partial answer (``X-SQL-State: S1TAT``, its anytime-query timeout) is retried.
  Datasets that are blank nodes have no identity across queries and are not read.

``harvester validate --type dcat-sparql <endpoint>`` reads the endpoint's first pages; a saved
answer of ``?s ?p ?o`` rows (a file, e.g. ``answer.srj``: what ``SELECT ?s ?p ?o WHERE { ?s ?p ?o }``
gives) is read as the RDF document of its triples (only a source reading one page, ``max_pages`` 1,
as ``validate_file`` sets it, takes an answer so; a harvest never does).
"""
from __future__ import annotations

import logging
import re
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any, Iterator, Mapping
from urllib.parse import urlencode, urlsplit

from rdflib import BNode, Graph, Literal, URIRef
from rdflib.namespace import DCTERMS

from harvester.config.languages import ISO_639_2, text_search_config
from harvester.config.portals import DCAT_SPARQL
from harvester.domain.dataset import DatasetRecord, failed, parse_timestamp
from harvester.domain.outcomes import problem
from harvester.http import Retryable, scrub_url
from harvester.sources.base import (EXACT_COUNT, Capabilities, CountsTraffic, FilterRejected, IdPage, Listing,
                                    SourceError, to_ms)
from harvester.sources.dcat_rdf import pick_language, record_from_node, records_from_graph
from harvester.sources.json_stream import loads

log = logging.getLogger(__name__)

KIND = DCAT_SPARQL
ACCEPT = "application/sparql-results+json"
MAX_PAGE = 1000  # datasets a listing page asks (far below Virtuoso's MaxSortedTopRows, 10,000)
DETAIL_ROWS = 10_000  # rows a details query asks at most (Virtuoso's default ResultSetMaxRows)
MAX_URL_BYTES = 8_000  # a GET's url (servers and proxies commonly take 8 KB)
MAX_IDS = 50  # datasets a details query asks at most
FILTER_SLACK = timedelta(days=1)  # the incremental filter compares days: a day early is still the filter
PREFIXES = ("PREFIX dcat: <http://www.w3.org/ns/dcat#>\n"
            "PREFIX dct: <http://purl.org/dc/terms/>\n"
            "PREFIX foaf: <http://xmlns.com/foaf/0.1/>\n")
# What IRIREF takes between < and > (SPARQL 1.1 grammar, rule 139): nothing else goes into a query as an IRI.
_IRIREF = re.compile(r'^[^\x00-\x20<>"{}|^`\\]+$')
_SURROGATE = re.compile(r"[\ud800-\udfff]")


# -- the queries ---------------------------------------------------------------------------------
def writable_iri(iri: Any) -> bool:
    """Whether ``iri`` can be written into a query as ``<iri>`` and nothing else."""
    return isinstance(iri, str) and bool(_IRIREF.match(iri)) and not _SURROGATE.search(iri)


def iri_ref(iri: str) -> str:
    if not writable_iri(iri):
        raise ValueError(f"{iri[:200]!r} cannot be written in a SPARQL query as an IRI")
    return f"<{iri}>"


def string_literal(text: str) -> str:
    """``text`` as a SPARQL string literal (STRING_LITERAL2 with ECHARs): nothing in it ends it."""
    if _SURROGATE.search(text):
        raise ValueError(f"{text[:200]!r} holds a lone UTF-16 surrogate and cannot be sent")
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r")
    return f'"{escaped}"'


def _in_graph(graph: str | None, patterns: str) -> str:
    """The patterns (lines indented by 4), inside ``GRAPH <graph> { }`` when a graph is named."""
    if not graph:
        return patterns
    inner = "\n".join("  " + line for line in patterns.split("\n"))
    return f"    GRAPH {iri_ref(graph)} {{\n{inner}\n    }}"


def since_day(since: datetime) -> str:
    """The first day an incremental listing keeps: the day before ``since`` (UTC)."""
    since = since.replace(tzinfo=timezone.utc) if since.tzinfo is None else since.astimezone(timezone.utc)
    return (since - FILTER_SLACK).date().isoformat()


def listing_query(*, graph: str | None, after: str | None, limit: int, since: datetime | None = None) -> str:
    """A keyset page: the datasets after ``after`` (an IRI; None: from the first), ``limit`` of
    them in IRI order, each with its latest modification date; with ``since``, only those dated on
    or after the day before it."""
    patterns = ("    ?dataset a dcat:Dataset .\n"
                "    FILTER(isIRI(?dataset))\n"
                "    OPTIONAL { ?dataset dct:modified ?own }\n"
                "    OPTIONAL { ?record foaf:primaryTopic ?dataset ; dct:modified ?recorded }\n"
                "    BIND(COALESCE(?own, ?recorded) AS ?m)")
    if after is not None:
        patterns += f"\n    FILTER(STR(?dataset) > {string_literal(after)})"
    if since is not None:
        patterns += f'\n    FILTER(BOUND(?m) && STR(?m) >= "{since_day(since)}")'
    return (f"{PREFIXES}SELECT ?dataset (MAX(?m) AS ?modified)\nWHERE {{\n{_in_graph(graph, patterns)}\n}}\n"
            f"GROUP BY ?dataset\nORDER BY STR(?dataset)\nLIMIT {int(limit)}")


def details_query(iris: list[str], *, graph: str | None, limit: int = DETAIL_ROWS) -> str:
    """Every triple about the datasets ``iris``, about the nodes they point to (distributions,
    publisher, contact point, blank nodes; blank nodes under those) and about their catalogue
    records, in dataset order, each dataset's rows ended by one row with ``?end`` bound: a dataset
    whose end row came was read whole, whatever the endpoint cut after it."""
    values = " ".join(iri_ref(i) for i in iris)
    patterns = ("    { ?dataset ?p ?o . BIND(?dataset AS ?s) }\n"
                "    UNION { ?dataset ?via ?s . ?s ?p ?o .\n"
                "            FILTER(isBlank(?s) || ?via IN (dcat:distribution, dct:publisher, dcat:contactPoint)) }\n"
                "    UNION { ?dataset dcat:distribution|dct:publisher|dcat:contactPoint ?node . ?node ?via ?s .\n"
                "            FILTER(isBlank(?s)) ?s ?p ?o }\n"
                "    UNION { ?s foaf:primaryTopic ?dataset . ?s ?p ?o }\n"
                "    UNION { ?dataset a dcat:Dataset . BIND(true AS ?end) }")
    return (f"{PREFIXES}SELECT ?dataset ?s ?p ?o ?end\nWHERE {{\n    VALUES ?dataset {{ {values} }}\n"
            f"{_in_graph(graph, patterns)}\n}}\nORDER BY STR(?dataset) ?end\nLIMIT {int(limit)}")


def count_query(*, graph: str | None) -> str:
    patterns = "    ?dataset a dcat:Dataset .\n    FILTER(isIRI(?dataset))"
    return f"{PREFIXES}SELECT (COUNT(DISTINCT ?dataset) AS ?n)\nWHERE {{\n{_in_graph(graph, patterns)}\n}}"


# -- SPARQL JSON -----------------------------------------------------------------------------------
def term(binding: Any) -> Any:
    """One RDF term of a SPARQL JSON row (``{"type": "uri"|"literal"|"typed-literal"|"bnode",
    "value", "xml:lang"?, "datatype"?}``) as rdflib's; None when it is not one. Literals keep their
    lexical form as written; a language tag rdflib refuses leaves the literal untagged."""
    if not isinstance(binding, Mapping) or not isinstance(binding.get("value"), str):
        return None
    kind, value = binding.get("type"), binding["value"]
    if kind == "uri":
        return URIRef(value)
    if kind == "bnode":
        return BNode(value)
    if kind in ("literal", "typed-literal"):  # (typed-literal: SPARQL 2008's JSON, still written by Virtuoso)
        lang, datatype = binding.get("xml:lang"), binding.get("datatype")
        lang = lang if isinstance(lang, str) and lang else None
        datatype = URIRef(datatype) if isinstance(datatype, str) and datatype and lang is None else None
        try:
            return Literal(value, lang=lang, datatype=datatype, normalize=False)
        except ValueError:  # a language tag that is not one
            return Literal(value, normalize=False)
    return None


def rows_of(answer: Any) -> list:
    """The rows of a SPARQL JSON results document; ValueError when it is not one."""
    if not isinstance(answer, Mapping) or not isinstance(answer.get("results"), Mapping) \
            or not isinstance(answer["results"].get("bindings"), list):
        raise ValueError("not SPARQL JSON results (no results.bindings list)")
    return answer["results"]["bindings"]


def graph_of(rows: list) -> tuple[Graph, int]:
    """The triples of ``?s ?p ?o`` rows as a graph, and how many rows were not triples."""
    graph, unusable = Graph(), 0
    for row in rows:
        if "end" in row:
            continue
        s, p, o = (term(row.get(v)) if isinstance(row, Mapping) else None for v in ("s", "p", "o"))
        if s is None or not isinstance(p, URIRef) or o is None or isinstance(s, Literal):
            unusable += 1
            continue
        graph.add((s, p, o))
    return graph, unusable


def declared_language(graph: Graph, dataset: URIRef, title: Literal | None, language: str | None) -> str | None:
    """The language of the record's text: its shown title's tag, else the dataset's ``dct:language``
    (an IRI such as .../authority/language/ITA, or a code) that text search stems, the portal's
    first when it is among them. None when neither says."""
    if title is not None and title.language:
        return title.language.lower()
    declared = []
    for value in sorted(str(v) for v in graph.objects(dataset, DCTERMS.language)):
        tag = value.strip().rstrip("/").rsplit("/", 1)[-1].rsplit("#", 1)[-1].lower()
        tag = ISO_639_2.get(tag, tag)
        if text_search_config(tag) is not None:
            declared.append(tag)
    if language and language in declared:
        return language
    return declared[0] if declared else None


def records_of(graph: Graph, iris: list[str], endpoint: str, language: str | None) -> list[DatasetRecord]:
    """The records of the datasets ``iris`` described in ``graph`` (those it says nothing about are
    gone since they were listed: left out)."""
    records = []
    for iri in iris:
        node = URIRef(iri)
        if (node, None, None) not in graph:
            continue
        record = record_from_node(graph, node, endpoint, language)
        if record.ok:
            titles = [o for o in graph.objects(node, DCTERMS.title) if isinstance(o, Literal)]
            record = replace(record, language=declared_language(graph, node, pick_language(titles, language),
                                                                language))
        records.append(record)
    return records


# -- the source ----------------------------------------------------------------------------------
class DcatSparqlSource(CountsTraffic):
    """The DCAT datasets of a SPARQL endpoint, GETs through ``fetcher`` (harvester.http.HttpFetcher).
    After a listing: ``listed``, ``pages``, ``loop_cut`` (cut: the endpoint's order or filter did
    not hold), ``complete`` (an empty page after a cursor that moved), ``row_cap`` (the most rows
    the endpoint was seen to answer, None while unknown)."""

    kind = KIND
    capabilities = Capabilities(incremental=True, reconcile=True, count=EXACT_COUNT)
    max_pages = 100_000

    def __init__(self, url: str, *, fetcher, portal=None, graph: str | None = None, language: str | None = None):
        self.url = url.split("#", 1)[0]  # (a #name is not sent)
        self.fetcher = fetcher
        self.portal = getattr(portal, "name", None) or scrub_url(self.url)
        self.graph = graph if graph is not None else getattr(portal, "graph", None)
        self.language = language if language is not None else getattr(portal, "language_code", None)
        if self.graph is not None:
            iri_ref(self.graph)  # (config/portals.py checked it; a caller's own must hold too)
        self.total: int | None = None
        self.listed = 0
        self.pages = 0
        self.loop_cut = False
        self.complete = False
        self.row_cap: int | None = None
        self.document: list | None = None  # the rows of a saved answer of triples (validate_file)

    def __repr__(self) -> str:
        return f"DcatSparqlSource({scrub_url(self.url)!r})"

    # -- one query -------------------------------------------------------------------------------
    def query_url(self, query: str) -> str:
        """The endpoint's url with ``query=`` added (after its own query string, if it has one)."""
        return self.url + ("&" if urlsplit(self.url).query else "?") + urlencode({"query": query})

    def ask(self, query: str | None, purpose: str, *, limit: int | None, filtered: bool = False) -> tuple[list, bool]:
        """The rows of ``query``'s answer (None: the url's own, a saved answer) and whether the
        endpoint said it cut them (Virtuoso's X-SPARQL-MaxRows). ``purpose`` names it in messages."""
        url = self.url if query is None else self.query_url(query)
        where = f"{self.portal}: the {purpose} query to {scrub_url(self.url)}"
        said_cut: list[bool] = []

        def parse(resp):
            if resp.status_code == 400:
                text = " ".join(resp.text.split())[:300] if resp.content else ""
                error = FilterRejected if filtered else SourceError
                raise error(f"{where} was refused (HTTP 400{': ' + text if text else ''})")
            if not 200 <= resp.status_code < 300:
                raise SourceError(f"{where}: HTTP {resp.status_code} {resp.reason or ''}".rstrip()
                                  + (" (is the portal's url a SPARQL endpoint?)" if resp.status_code == 404 else ""))
            if (resp.headers.get("X-SQL-State") or "").strip().upper() == "S1TAT":
                raise Retryable("a partial answer (X-SQL-State S1TAT: the endpoint's query timeout)")
            try:
                rows = rows_of(loads(resp.content))  # (any depth: sources/json_stream.py)
            except ValueError as exc:  # a proxy's page, a cut body: try again
                raise Retryable(f"the answer is not SPARQL JSON results ({str(exc)[:200]})") from exc
            capped = resp.headers.get("X-SPARQL-MaxRows")
            if capped is not None:
                said_cut.append(True)
                if capped.strip().isdigit() and int(capped) > 0:
                    self.row_cap = min(self.row_cap or int(capped), int(capped))
            if limit is not None and len(rows) > limit:
                raise SourceError(f"{where} was answered {len(rows)} rows, more than the {limit} it asked for "
                                  "(the endpoint ignores LIMIT)")
            bad = next((i for i, row in enumerate(rows) if not isinstance(row, Mapping)), None)
            if bad is not None:
                raise SourceError(f"{where}: row {bad} of the answer is {type(rows[bad]).__name__}, not an object")
            return rows

        rows = self.fetcher.get(url, headers={"Accept": ACCEPT}, parse=parse, what=f"{self.portal}: {purpose} query")
        return rows, bool(said_cut)

    # -- the keyset listing ------------------------------------------------------------------------
    def _keyset(self, since: datetime | None, page_size: int) -> Iterator[list[tuple[str, str | None]]]:
        """Pages of (dataset IRI, modification date as written); sets ``complete``, ``loop_cut``."""
        self.listed = self.pages = 0
        self.complete = self.loop_cut = False
        limit = max(1, min(int(page_size), MAX_PAGE))
        cursor: str | None = None
        purpose = "incremental listing" if since is not None else "listing"
        if self.max_pages == 1:
            yield from self._saved_answer()
            return
        for _ in range(self.max_pages):
            query = listing_query(graph=self.graph, after=cursor, limit=limit, since=since)
            rows, _ = self.ask(query, purpose, limit=limit, filtered=since is not None)
            self.pages += 1
            if not rows:
                self.complete = True
                return
            page: list[tuple[str, str | None]] = []
            previous = cursor
            for row in rows:
                dataset, modified = term(row.get("dataset")), term(row.get("modified"))
                iri = str(dataset) if isinstance(dataset, URIRef) else None
                if iri is None or (previous is not None and not iri > previous):
                    log.warning("%s: the %s answered %s after %s: not past it, so the endpoint does not keep "
                                "to the query's FILTER or ORDER BY; listing cut there, nothing removed",
                                self.portal, purpose, "a row without a dataset IRI" if iri is None else repr(iri[:200]),
                                repr((previous or "")[:200]) if previous is not None else "the start")
                    self.loop_cut = True
                    if page:
                        self.listed += len(page)
                        yield page
                    return
                previous = iri
                page.append((iri, str(modified) if isinstance(modified, Literal) else None))
            if since is not None:
                self._check_filtered(page, since)
            self.listed += len(page)
            yield page
            cursor = page[-1][0]
            if _SURROGATE.search(cursor):
                log.warning("%s: %r cannot be sent as the next page's cursor; listing cut there, nothing removed",
                            self.portal, cursor[:200])
                self.loop_cut = True
                return
        log.warning("%s: more than %d pages; listing stopped, nothing removed", self.portal, self.max_pages)
        self.loop_cut = True

    def _saved_answer(self) -> Iterator[list[tuple[str, str | None]]]:
        """A document, not an endpoint (validate_file reads one page: ``max_pages`` 1): a saved answer
        of ``?s ?p ?o`` rows, read whole as the RDF document of its triples (``document``)."""
        rows, _ = self.ask(None, "saved answer", limit=None)
        self.pages = 1
        if rows and not all(v in rows[0] for v in ("s", "p", "o")):
            raise SourceError(f"{scrub_url(self.url)}: a saved SPARQL answer is read as the triples of its ?s ?p ?o "
                              f"rows; this one's first row binds {', '.join(sorted(rows[0]))[:200]}")
        self.document, self.complete = rows, True
        return iter(())

    def _check_filtered(self, page: list[tuple[str, str | None]], since: datetime) -> None:
        first_day = datetime.fromisoformat(since_day(since)).replace(tzinfo=timezone.utc)
        for iri, modified in page:
            when = parse_timestamp(modified)
            if modified is None or (when is not None and when < first_day - FILTER_SLACK):
                raise FilterRejected(f"{self.portal}: the incremental listing of {scrub_url(self.url)} ignored the "
                                     f"modified filter: dataset {iri[:200]!r} was modified "
                                     f"{'at ' + modified[:40] if modified else 'at no date given'}, before "
                                     f"{since_day(since)}")

    # -- details -------------------------------------------------------------------------------------
    def _batches(self, iris: list[str], per_request: int) -> Iterator[list[str]]:
        """``iris`` in runs of at most ``per_request`` whose details query fits MAX_URL_BYTES."""
        batch: list[str] = []
        for iri in iris:
            if batch and (len(batch) >= per_request
                          or len(self.query_url(details_query(batch + [iri], graph=self.graph))) > MAX_URL_BYTES):
                yield batch
                batch = []
            batch.append(iri)
        if batch:
            yield batch

    def _described(self, iris: list[str], per_request: int = MAX_IDS) -> Iterator[list[DatasetRecord]]:
        """The records of ``iris`` (writable ones), a list per answer. An answer is read up to its
        last dataset whose end row came (every dataset before it in order is whole, or gone if it
        gave no row); the datasets after it are asked again, since the endpoint may have cut the
        answer there (Virtuoso's ResultSetMaxRows, without a word). A dataset asked alone whose end
        row does not come though it has rows is too large for one answer: its failed record."""
        todo = list(self._batches(iris, max(1, per_request)))
        while todo:
            batch = todo.pop(0)
            rows, _ = self.ask(details_query(batch, graph=self.graph), "details", limit=DETAIL_ROWS)
            ended = {str(term(row.get("dataset"))) for row in rows if "end" in row}
            whole = [i for i in batch if i in ended]
            last = max(whole) if whole else None
            rest = [i for i in batch if i not in ended and (last is None or i > last)]
            if rest and len(rest) < len(batch):
                todo.insert(0, rest)
            elif rest and any(str(term(row.get("dataset"))) in rest for row in rows):
                # no dataset of the batch came whole: the first one alone is more than one answer holds
                first = min(rest)
                if len(batch) > 1:
                    todo[:0] = [[first], [i for i in rest if i != first]]
                else:
                    yield [failed(first, {"id": first}, [problem(
                        "record-too-large", f"dataset {first[:200]!r}: the endpoint's answer describing it alone was "
                        f"{len(rows)} rows long, came without its end row (cut by the endpoint's row limit), so it cannot be "
                        "read whole", "dcat:Dataset", first)])]
                    continue
            wanted = [i for i in batch if i in ended]
            if not wanted:
                continue
            graph, unusable = graph_of([row for row in rows if str(term(row.get("dataset"))) in ended])
            if unusable:
                log.warning("%s: %d rows of a details answer are not triples; left out", self.portal, unusable)
            records = records_of(graph, wanted, self.url, self.language)
            if records:
                yield records

    def _records(self, iris: list[str], per_request: int = MAX_IDS) -> Iterator[list[DatasetRecord]]:
        unwritable = [i for i in iris if not writable_iri(i)]
        if unwritable:
            yield [failed(i if not _SURROGATE.search(i) else None, {"id": i[:1000]}, [problem(
                "no-identifier", f"dataset {i[:200]!r}: its IRI holds characters an IRI in a SPARQL query cannot "
                "(spaces, controls or any of <>\"{}|^`\\), so its description cannot be asked for", "dcat:Dataset",
                i)]) for i in unwritable]
        yield from self._described([i for i in iris if writable_iri(i)], per_request)

    # -- the Source protocol -------------------------------------------------------------------------
    def iter_records(self, since: datetime | None, page_size: int, listing: Listing,
                     validators: dict | None = None) -> Iterator[list[DatasetRecord]]:
        """Pages of records of the datasets modified since ``since`` (all when None): one keyset
        page, then its details. ``listing.complete``: an unfiltered listing ended by an empty page."""
        self.document = None
        for page in self._keyset(since, page_size):
            records = [r for batch in self._records([iri for iri, _ in page]) for r in batch]
            if records:
                yield records
        if self.document is not None:
            yield self._document_records(self.document)
        listing.complete = since is None and self.complete and not self.loop_cut

    def _document_records(self, rows: list) -> list[DatasetRecord]:
        """Every dcat:Dataset of a saved answer of ``?s ?p ?o`` rows, as an RDF document of them gives."""
        graph, _ = graph_of(rows)
        records = records_from_graph(graph, self.url, self.language)
        out = []
        for record in records:
            node = URIRef(record.source_id) if record.ok else None
            if node is not None and (node, None, None) in graph:
                titles = [o for o in graph.objects(node, DCTERMS.title) if isinstance(o, Literal)]
                record = replace(record, language=declared_language(
                    graph, node, pick_language(titles, self.language), self.language))
            out.append(record)
        return out

    def list_ids(self, page_size: int) -> Iterator[IdPage]:
        """Every dataset IRI with its modification date, by keyset. A listing cut (the endpoint's
        order or filter did not hold) raises SourceError after its last page."""
        for page in self._keyset(None, page_size):
            ids, unusable = [], 0
            for iri, modified in page:
                if not writable_iri(iri):
                    unusable += 1
                    continue
                when = parse_timestamp(modified)
                ids.append((iri, to_ms(when) if when else None))
            yield IdPage(ids, unusable)
        if not self.complete or self.loop_cut:
            raise SourceError(f"{self.portal}: the identifier listing of {scrub_url(self.url)} was cut short "
                              f"({self.pages} pages read) and cannot be reconciled with")

    def fetch_by_ids(self, ids: list[str], per_request: int = MAX_IDS) -> Iterator[list[DatasetRecord]]:
        """The records of ``ids`` (VALUES queries); ids the endpoint no longer describes are left out."""
        yield from self._records(list(dict.fromkeys(ids)), min(per_request, MAX_IDS))

    def count(self) -> int | None:
        """COUNT(DISTINCT ?dataset): one query."""
        rows, _ = self.ask(count_query(graph=self.graph), "count", limit=1)
        value = term(rows[0].get("n")) if rows else None
        try:
            n = int(str(value)) if isinstance(value, Literal) else None
        except ValueError:
            return None
        self.total = n if n is not None and n >= 0 else None
        return self.total
