"""A local SPARQL endpoint (test-only) that answers like a Virtuoso server (data.europa.eu's):
real SPARQL 1.1, evaluated by rdflib's engine over the triples the test loads (real DCAT-AP
catalogues of ../shared/dcat-samples, and catalogues of thousands derived from them), answered as
SPARQL 1.1 Query Results JSON to ``GET /sparql?query=`` (or a form POST), with Virtuoso's limits:

- ``result_cap`` (Virtuoso's ResultSetMaxRows, 10,000 by default): an answer is cut there without
  an error; ``maxrows_header`` adds Virtuoso's ``X-SPARQL-MaxRows`` header to a cut answer (a proxy
  in front of it may drop the header: off by default);
- ``max_sorted_rows`` (MaxSortedTopRows, 10,000): an ORDER BY whose OFFSET + LIMIT is more is
  refused with HTTP 500 and Virtuoso's text (``Virtuoso 22023 Error SR353: Sorted TOP clause
  specifies more then 11000 rows to sort. Only 10000 are allowed. ...``);
- a query that does not parse: HTTP 400 with ``Virtuoso 37000 Error SP030: SPARQL compiler ...``;
- without ``Accept: application/sparql-results+json`` (or json), an HTML page, as Virtuoso's
  endpoint answers a browser.

Every query is recorded (``queries``, ``requests``). Faults for the next queries (``fail_next``): a
status (5xx, 429 with Retry-After), a body cut short, an HTML page, a partial answer (Virtuoso's
``X-SQL-State: S1TAT``), a body that never ends, a document nested deep. ``ignore_filter``
answers as if the keyset FILTER on ``STR(?dataset)`` were not in the query (a cursor that never
advances); ``ignore_modified_filter`` drops the incremental filter.
"""
from __future__ import annotations

import json
import re
import threading
import time
from datetime import datetime, timedelta, timezone
from urllib.parse import parse_qs, urlsplit

from rdflib import BNode, Dataset, Graph, Literal, URIRef
from rdflib.namespace import DCAT, DCTERMS, RDF, XSD
from rdflib.plugins.sparql import prepareQuery

from harvester.testing.local_http import LocalServer, QuietHandler
from harvester.testing.samples import dcat_samples_dir, existing

PATH = "/sparql"
UNIBO = "dcat-ap/ckanext-dcatapit/catalog_dati_unibo.rdf"  # 12 datasets, titles in Italian and English
DCATDE = "dcat-ap/ckanext-dcatde/catalog-endpoint.rdf"  # 6 datasets, German
_KEYSET = re.compile(r'\n\s*FILTER\(STR\(\?dataset\) > "(?:[^"\\]|\\.)*"\)')
_MODIFIED = re.compile(r'\n\s*FILTER\(BOUND\(\?m\) && STR\(\?m\) >= "[^"]*"\)')
_ORDER = re.compile(r"\bORDER\s+BY\b", re.I)
_LIMIT = re.compile(r"\bLIMIT\s+(\d+)", re.I)
_OFFSET = re.compile(r"\bOFFSET\s+(\d+)", re.I)


def sample_graph(name: str) -> Graph:
    """A real DCAT-AP catalogue of ../shared/dcat-samples, parsed by the hardened RDF reader the
    dcat-rdf source uses."""
    from harvester.sources.dcat_rdf import parse_page

    path = existing(dcat_samples_dir() / name)
    return parse_page(path.read_bytes(), "application/rdf+xml", f"http://samples.invalid/{path.name}")


def dataset_iris(graph: Graph) -> list[str]:
    return sorted(str(d) for d in graph.subjects(RDF.type, DCAT.Dataset) if isinstance(d, URIRef))


def _closure(graph: Graph, dataset) -> list[tuple]:
    """The triples of a dataset and of the nodes only it describes (blank nodes, distributions)."""
    out, todo, seen = [], [dataset], set()
    while todo:
        node = todo.pop()
        if node in seen:
            continue
        seen.add(node)
        for s, p, o in graph.triples((node, None, None)):
            out.append((s, p, o))
            if isinstance(o, BNode) or (p == DCAT.distribution and isinstance(o, URIRef)):
                todo.append(o)
    return out


def derived_catalogue(base: Graph, n: int, *, prefix: str = "https://data.example.org/dataset/",
                      start: datetime = datetime(2024, 1, 1, tzinfo=timezone.utc)) -> Graph:
    """``n`` datasets made from the real datasets of ``base``, in turn: new IRIs
    (``<prefix><i:06d>``, distributions ``.../distribution/<j>``), every title numbered (in each of
    its languages), ``dct:modified`` one minute apart in 2024. The nodes they share (publishers,
    themes, licences) are kept once."""
    sources = [URIRef(i) for i in dataset_iris(base)]
    closures = {d: _closure(base, d) for d in sources}
    shared = Graph()
    inner = {s for c in closures.values() for s, _, _ in c}
    for s, p, o in base:
        if s not in inner and not (p == RDF.type and o == DCAT.Catalog) and p != DCAT.dataset:
            shared.add((s, p, o))
    out = Graph()
    for t in shared:
        out.add(t)
    for i in range(n):
        dataset = sources[i % len(sources)]
        iri = URIRef(f"{prefix}{i:06d}")
        renamed: dict = {dataset: iri}

        def name(node):
            if node not in renamed:
                renamed[node] = BNode() if isinstance(node, BNode) else URIRef(f"{iri}/distribution/{len(renamed)}")
            return renamed[node]

        for s, p, o in closures[dataset]:
            if s == dataset and p in (DCTERMS.modified, DCTERMS.identifier):
                continue
            if s == dataset and p == DCTERMS.title and isinstance(o, Literal):
                o = Literal(f"{o} {i}", lang=o.language, datatype=o.datatype)
            obj = name(o) if (isinstance(o, BNode) or (p == DCAT.distribution and isinstance(o, URIRef))) else o
            out.add((name(s), p, obj))
        out.add((iri, DCTERMS.identifier, Literal(f"{i:06d}")))
        out.add((iri, DCTERMS.modified, Literal((start + timedelta(minutes=i)).strftime("%Y-%m-%dT%H:%M:%SZ"),
                                                 datatype=XSD.dateTime)))
    return out


def _json_term(node) -> dict:
    if isinstance(node, URIRef):
        return {"type": "uri", "value": str(node)}
    if isinstance(node, BNode):
        return {"type": "bnode", "value": str(node)}
    out = {"type": "literal", "value": str(node)}
    if node.language:
        out["xml:lang"] = node.language
    elif node.datatype:
        out["datatype"] = str(node.datatype)
    return out


class SparqlServer(LocalServer):
    """A SPARQL endpoint over a copy of ``graph`` (an rdflib Graph), its triples in the named graph
    ``graph_name`` when given (queries without GRAPH then see every graph, as Virtuoso's default
    does; ``store.graph(iri)`` holds others)."""

    name = "sparql-server"

    def __init__(self, graph: Graph | None = None, *, graph_name: str | None = None, result_cap: int = 10_000,
                 maxrows_header: bool = False, max_sorted_rows: int = 10_000):
        # rdflib's Dataset answers several times slower than a Graph: only an endpoint with a named graph has one
        self.store = Dataset(default_union=True) if graph_name else Graph()
        self.graph_name = URIRef(graph_name) if graph_name else None
        self.result_cap, self.maxrows_header, self.max_sorted_rows = result_cap, maxrows_header, max_sorted_rows
        self.ignore_filter = False
        self.ignore_modified_filter = False
        self.requests: list[str] = []
        self.queries: list[str] = []
        self._faults: list[dict] = []
        self._lock = threading.Lock()
        if graph is not None:
            self.load(graph)
        super().__init__()

    @property
    def url(self) -> str:
        return self.base_url + PATH

    @property
    def data(self) -> Graph:
        return self.store.graph(self.graph_name) if self.graph_name else self.store

    # -- what the test changes ------------------------------------------------------------------------
    def load(self, graph: Graph) -> None:
        with self._lock:
            data = self.data
            data += graph

    def edit(self, iri: str, *, modified: str | None = None, title: str | None = None, lang: str | None = None) -> None:
        """The dataset ``iri`` edited: its title (in ``lang``) replaced, its dct:modified set."""
        node = URIRef(iri)
        with self._lock:
            data = self.data
            if title is not None:
                for old in list(data.objects(node, DCTERMS.title)):
                    if not isinstance(old, Literal) or (old.language or None) == lang:
                        data.remove((node, DCTERMS.title, old))
                data.add((node, DCTERMS.title, Literal(title, lang=lang)))
            if modified is not None:
                data.remove((node, DCTERMS.modified, None))
                data.add((node, DCTERMS.modified, Literal(modified, datatype=XSD.dateTime)))

    def remove(self, iri: str) -> None:
        with self._lock:
            self.data.remove((URIRef(iri), None, None))

    def fail_next(self, n: int = 1, *, status: int = 503, retry_after: str | None = None, truncate: bool = False,
                  html: bool = False, partial: bool = False, endless: bool = False, deep: bool = False) -> None:
        """The next ``n`` queries fail: ``status`` (with ``Retry-After``); or a 200 whose body is cut
        half-way (``truncate``), an HTML page (``html``), a partial answer with X-SQL-State S1TAT
        (``partial``), a body that never ends (``endless``), a JSON document nested 100,000 levels
        (``deep``)."""
        with self._lock:
            self._faults.extend({"status": status, "retry_after": retry_after, "truncate": truncate, "html": html,
                                 "partial": partial, "endless": endless, "deep": deep} for _ in range(n))

    def kinds_of_queries(self) -> list[str]:
        """Each query received, named: listing, incremental, details, count or other."""
        out = []
        for q in self.queries:
            if "COUNT(DISTINCT" in q:
                out.append("count")
            elif "VALUES ?dataset" in q:
                out.append("details")
            elif "GROUP BY ?dataset" in q:
                out.append("incremental" if "BOUND(?m)" in q else "listing")
            else:
                out.append("other")
        return out

    # -- answering ------------------------------------------------------------------------------------
    def answer(self, query: str) -> tuple[int, dict, bytes]:
        """(status, headers, body) of one query, as Virtuoso would answer it."""
        if self.ignore_filter:
            query = _KEYSET.sub("", query)
        if self.ignore_modified_filter:
            query = _MODIFIED.sub("", query)
        try:
            prepared = prepareQuery(query)
        except Exception as exc:  # pyparsing's ParseException and rdflib's own
            text = " ".join(str(exc).split())
            return 400, {"Content-Type": "text/plain"}, (
                f"Virtuoso 37000 Error SP030: SPARQL compiler, line 1: syntax error at {text[:200]}\n\n"
                f"SPARQL query:\n{query}").encode()
        limit, offset = _LIMIT.search(query), _OFFSET.search(query)
        if _ORDER.search(query) and offset:
            rows = int(offset.group(1)) + (int(limit.group(1)) if limit else 0)
            if rows > self.max_sorted_rows:
                return 500, {"Content-Type": "text/plain"}, (
                    f"Virtuoso 22023 Error SR353: Sorted TOP clause specifies more then {rows} rows to sort. Only "
                    f"{self.max_sorted_rows} are allowed. Either decrease the offset and/or row count or use a "
                    f"scrollable cursor\n\nSPARQL query:\n{query}").encode()
        with self._lock:
            result = self.store.query(prepared)
            names = [str(v) for v in result.vars]
            rows = [{name: _json_term(row[i]) for i, name in enumerate(names) if row[i] is not None}
                    for row in result]
        headers = {"Content-Type": "application/sparql-results+json"}
        if len(rows) > self.result_cap:
            rows = rows[:self.result_cap]
            if self.maxrows_header:
                headers["X-SPARQL-MaxRows"] = str(self.result_cap)
        body = json.dumps({"head": {"vars": names}, "results": {"distinct": False, "ordered": True,
                                                                 "bindings": rows}}).encode()
        return 200, headers, body

    def _handler(self):
        server = self

        class Handler(QuietHandler):
            content_type = "application/sparql-results+json"

            def _serve(self, query: str | None):
                with server._lock:
                    server.requests.append(self.path)
                    fault = server._faults.pop(0) if server._faults and query else None
                if query is None:
                    self._send_typed(400, "text/plain", b"Virtuoso 22023 Error HT006: No query given")
                    return
                server.queries.append(query)
                accept = self.headers.get("Accept") or ""
                if "sparql-results+json" not in accept and "application/json" not in accept:
                    self._send_typed(200, "text/html", b"<html><body><table><tr><th>dataset</th></tr></table>"
                                                       b"</body></html>")
                    return
                if fault and fault["endless"]:
                    self._endless()
                    return
                if fault and fault["deep"]:
                    self._send_typed(200, "application/sparql-results+json",
                                     b'{"head": {"vars": []}, "results": {"bindings": [' + b"[" * 100_000
                                     + b"]" * 100_000 + b"]}}")
                    return
                if fault and fault["html"]:
                    self._send_typed(200, "text/html", b"<html><body>Service temporarily in maintenance</body></html>")
                    return
                if fault and not (fault["truncate"] or fault["partial"]):
                    headers = {"Retry-After": fault["retry_after"]} if fault["retry_after"] else {}
                    text = (b"Virtuoso 37000 Error SP030: SPARQL compiler, line 9: syntax error at 'STR' before '('"
                            if fault["status"] == 400 else b"Virtuoso 08C01 Error CL: Cluster: No connection")
                    self._send_typed(fault["status"], "text/plain", text, headers)
                    return
                status, headers, body = server.answer(query)
                if fault and fault["truncate"]:
                    body = body[:len(body) // 2]
                if fault and fault["partial"]:
                    headers = {**headers, "X-SQL-State": "S1TAT",
                               "X-SQL-Message": "RC...: Returning incomplete results, query interrupted by result "
                                                "timeout.  Activity:  1R rnd  0R seq  0P disk  0B / 0 messages"}
                self._send_typed(status, headers.pop("Content-Type"), body, headers)

            def _send_typed(self, status: int, content_type: str, body: bytes, headers: dict | None = None):
                self.content_type = content_type
                self._send(status, body, headers)

            def _endless(self):
                self.send_response(200)
                self.send_header("Content-Type", "application/sparql-results+json")
                self.end_headers()
                try:
                    self.wfile.write(b'{"head": {"vars": ["dataset"]}, "results": {"bindings": [')
                    chunk = b'{"dataset": {"type": "uri", "value": "https://x.org/d"}}, ' * 1000
                    deadline = time.monotonic() + 120
                    while time.monotonic() < deadline:
                        self.wfile.write(chunk)
                except OSError:
                    pass
                self.close_connection = True

            def do_GET(self):
                parts = urlsplit(self.path)
                if parts.path != PATH:
                    self._send_typed(404, "text/html", b"<html><body>Not found</body></html>")
                    return
                self._serve(parse_qs(parts.query).get("query", [None])[-1])

            def do_POST(self):
                length = int(self.headers.get("Content-Length") or 0)
                form = parse_qs(self.rfile.read(length).decode("utf-8", "replace"))
                self._serve(form.get("query", [None])[-1])

        return Handler


def sample_catalogue() -> Graph:
    """The real datasets of two DCAT-AP catalogue exports, unchanged: dati.unibo.it's 12 (titles in
    Italian and English) and a DCAT-AP.de CKAN endpoint's 6 (German)."""
    graph = Graph()
    for name in (UNIBO, DCATDE):
        for triple in sample_graph(name):
            graph.add(triple)
    return graph


def bench_catalogue(n: int):
    """(an unstarted SparqlServer of ``n`` datasets derived from dati.unibo.it's, the endpoint's url)."""
    server = SparqlServer(derived_catalogue(sample_graph(UNIBO), n))
    return server, lambda: server.url
