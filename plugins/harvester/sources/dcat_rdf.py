"""DCAT-AP catalogues in RDF (``dcat-rdf``): RDF/XML, Turtle or JSON-LD pages, Hydra-paged.

Each ``dcat:Dataset`` of a page becomes a ``DatasetRecord`` whose ``raw`` is a CKAN-shaped package
(``id``, ``title``, ``notes``, ``tags``, ``organization``, ``groups``, ``resources``, ``license_id``,
``metadata_modified``, ``extras``, ...), so hashes, change detection and search keys work on it
exactly as on a CKAN package. The mapping (``records_from_graph``) needs no network.

- Identity: the dataset's IRI; a blank node is named by its ``dct:identifier``, else by its
  landing page (``landing:<sha256 of the normalized URL>``), else the record is failed.
- Text: the literal in the preferred language (``language``, else English, else untagged, else
  the first tag in sorted order); every language is kept in ``translations`` (title, description,
  keywords).
- Dates are kept as written; a lexical form that is not a date leaves ``metadata_modified`` None.
- Everything else the dataset says (identifier, spatial, temporal, contact point, ...) goes into
  ``extras``, blank nodes written out as nested dicts, so the metadata hash sees it.

Validation (``validate``): DCAT-AP 3.0's mandatory properties and ranges of the classes Harvester
reads, checked by rules over the graph already parsed: a few triple lookups per dataset, no SPARQL.
Not SHACL: the published DCAT-AP shapes come from no package registry (PyPI has no package that
ships them), pySHACL would be a second dependency to run them, and a full SHACL run costs far more
per page than these lookups; the rules below are the part of the shapes a harvester acts on.
An error keeps the dataset out (a Failed record, ``domain.dataset.failed``); a warning is reported
with the stored record. Field = the property's prefixed name (``dcat:distribution[<IRI or n>].x``).

- ``dcat:Dataset`` identity (IRI, ``dct:identifier`` or landing page): ``no-identifier`` (error).
- ``dct:title``, a literal: ``no-title`` (error).
- ``dct:description`` (mandatory in DCAT-AP): only the content warning ``no-description``
  (domain/quality.py), not ``missing-mandatory``: 3 of the 42 titled sample datasets lack it, and
  they are real portal records (both of opendata.swiss' catalogue; GeoNetwork's, which writes
  ``dct:abstract``, read as the description); dropping them would take real datasets out of search
  for a field the search can do without.
- ``dct:modified`` (the dataset's, else its catalogue record's): a resource, or a literal that is not
  an xsd:date / xsd:dateTime (a year or year-month is taken): ``bad-range`` (error: Harvester's
  change detection reads it). An empty literal is read as no date: ``range-tolerated`` (warning;
  the SEMIC ISO-to-GeoDCAT-AP conversion writes empty dates, see the open-datara sample).
- ``dct:issued``: the same tests, ``bad-optional-date`` (warning).
- ``dcat:distribution``, ``dct:publisher``, ``dcat:contactPoint``: a literal is ``bad-range`` (error).
- ``dcat:landingPage`` not an IRI, ``dcat:theme`` a literal, ``dcat:keyword`` not a literal,
  ``dcat:accessURL`` of a distribution not an IRI: ``range-tolerated`` (warning, not ``bad-range``:
  opendata.swiss writes landing pages and access URLs as literals, udata's fixtures themes too;
  Harvester reads the text as written, a keyword IRI is left out of the tags).
- ``dct:publisher`` or ``dcat:contactPoint`` missing: ``recommended-missing`` (warning; the other
  recommended properties have content warnings already: ``no-distribution``, ``no-license``).
- A ``dcat:Distribution`` without ``dcat:accessURL``: ``distribution-incomplete`` (warning: the
  dataset is stored; GeoNetwork links distributions it does not describe).

Paging (``iter_pages``) follows Hydra ``next`` / legacy ``nextPage`` links of the page's
``PagedCollection`` / ``PartialCollectionView`` node; a page seen twice or more than ``max_pages``
pages end the listing with a warning (``complete`` False). A page that does not parse raises
``RdfParseError`` naming the URL.

Untrusted pages (issue 35). Remote JSON-LD contexts, at any depth (a context string or list, one a
fetched context names, ``@import``, scoped contexts of term definitions), are fetched through the
same ``fetch`` (the source's guarded client), once per listing, and inlined: only http(s), at most
``_MAX_CONTEXT_FETCHES`` fetches and ``_MAX_CONTEXT_DEPTH`` levels a page, no cycle, inlined copies
capped (``_MAX_INLINED_CONTEXT_BYTES``); anything else is an ``RdfParseError`` naming it, never
opened. rdflib opens nothing itself: its JSON-LD context loader is replaced by a refusal, and RDF/XML
is read by our expat reader, which reads no external DTD or entity and refuses entity declarations
other than short plain text. Parsing is linear in the page: rdflib's RDF/XML handler, Turtle/N3
string reading and N-Triples line reading are replaced (``_PARSERS``) by versions that collect text
in lists, the text an RDF/XML page expands to is capped, JSON nests at most ``_MAX_JSON_DEPTH``
levels, and a page nested past Python's recursion limit is an ``RdfParseError``.
"""
from __future__ import annotations

import codecs
import io
import json
import logging
import re
import threading
import xml.sax.handler
from contextlib import contextmanager
from typing import Any, Callable, Iterable, Iterator
from urllib.parse import urljoin, urlsplit
from xml.parsers import expat as pyexpat
from xml.sax.expatreader import ExpatParser
from xml.sax.saxutils import escape as xml_escape, quoteattr

import rdflib
import rdflib.exceptions
import rdflib.parser
import rdflib.plugin
import rdflib.plugins.shared.jsonld.context as _jsonld_context
from rdflib import BNode, Graph, Literal, URIRef
from rdflib.namespace import DCAT, DCTERMS, FOAF, RDF, RDFS, SKOS, Namespace
from rdflib.plugins.parsers.notation3 import BadSyntax as N3BadSyntax, RDFSink as N3RDFSink, SinkParser, TurtleParser
from rdflib.plugins.parsers.notation3 import interesting as _N3_INTERESTING
from rdflib.plugins.parsers.ntriples import NTGraphSink, NTParser, W3CNTriplesParser, r_line as _NT_LINE
from rdflib.plugins.parsers.rdfxml import RDFXMLHandler, RDFXMLParser

from harvester.config.portals import DCAT_RDF
from harvester.domain.dataset import (DatasetRecord, clean_text, failed, normalize_url, package_record,
                                      parse_timestamp, sha256_hex, slug)
from harvester.domain.outcomes import ERROR, Problem, problem
from harvester.sources.base import Capabilities, CountsTraffic, Listing, SourceError
from harvester.http import scrub_url

log = logging.getLogger(__name__)

Fetch = Callable[[str], tuple[bytes, str]]

ACCEPT = "application/rdf+xml, text/turtle, application/ld+json;q=0.9, */*;q=0.1"
VCARD = Namespace("http://www.w3.org/2006/vcard/ns#")
# The W3C namespace and the one Hydra had before it moved there (all the samples use the W3C one).
HYDRA_NAMESPACES = (Namespace("http://www.w3.org/ns/hydra/core#"), Namespace("http://purl.org/hydra/core#"))

_CONTENT_TYPES = {
    "application/rdf+xml": "xml", "application/xml": "xml", "text/xml": "xml",
    "text/turtle": "turtle", "application/x-turtle": "turtle", "text/n3": "n3",
    "application/n-triples": "nt", "application/ld+json": "json-ld", "application/json": "json-ld",
}
_SUFFIXES = {".rdf": "xml", ".xml": "xml", ".owl": "xml", ".ttl": "turtle", ".n3": "n3", ".nt": "nt",
             ".jsonld": "json-ld", ".json": "json-ld"}
_GUESS_ORDER = ("xml", "turtle", "json-ld")
_MAX_CONTEXT_FETCHES = 10  # remote JSON-LD contexts fetched per page
_MAX_CONTEXT_DEPTH = 5  # remote contexts naming remote contexts, this deep at most
_MAX_INLINED_CONTEXT_BYTES = 32 * 1024 * 1024  # a page's remote contexts, as inlined where it names them
_MAX_JSON_DEPTH = 100  # JSON nesting of a JSON-LD page or context (rdflib's parser recurses a level at a time)
_MAX_XML_ENTITY_CHARS = 1024  # an RDF/XML entity's text
# The text an RDF/XML page may expand to (character data and attribute values, entities expanded):
# this many times its size, plus the extra (namespace entities in attributes expand a few times).
_MAX_XML_TEXT_FACTOR, _MAX_XML_TEXT_EXTRA = 10, 1024 * 1024
_NODE_DEPTH = 3  # how deep blank nodes are written out into extras

# Predicates mapped to package fields; everything else the dataset says goes into extras.
_MAPPED = frozenset({
    RDF.type, DCTERMS.title, DCTERMS.description, DCAT.keyword, DCTERMS.publisher, DCAT.theme,
    DCAT.distribution, DCTERMS.license, DCTERMS.modified, DCTERMS.issued, DCAT.landingPage,
})
# IRI objects of these predicates are written out (like blank nodes) when the page describes them.
_EXPANDED = frozenset({DCAT.contactPoint, DCTERMS.temporal, DCTERMS.spatial})
_PREFIXES = {
    str(DCTERMS): "dct", str(DCAT): "dcat", str(FOAF): "foaf", str(VCARD): "vcard", str(RDF): "rdf",
    str(RDFS): "rdfs", str(SKOS): "skos", "http://www.w3.org/ns/adms#": "adms", "http://schema.org/": "schema",
    "http://spdx.org/rdf/terms#": "spdx", "http://data.europa.eu/r5r/": "dcatap",
    "http://dcat-ap.de/def/dcatde/": "dcatde", "http://www.w3.org/2002/07/owl#": "owl",
    "http://www.w3.org/ns/prov#": "prov", "http://www.w3.org/ns/locn#": "locn",
    "http://data.europa.eu/930/": "geodcatap", "http://www.w3.org/ns/odrl/2/": "odrl",
}


class RdfParseError(ValueError):
    """A page could not be read as RDF; the message names its URL and the parser's error."""

    transient = False


# -- parsing -----------------------------------------------------------------------------------
def rdf_format(content_type: str | None, url: str) -> str | None:
    """The rdflib format named by the Content-Type, else by the URL's suffix; None: unknown."""
    media = (content_type or "").split(";")[0].strip().lower()
    if media in _CONTENT_TYPES:
        return _CONTENT_TYPES[media]
    path = urlsplit(url).path.lower()
    for suffix, fmt in _SUFFIXES.items():
        if path.endswith(suffix):
            return fmt
    return None


def parse_page(body: bytes, content_type: str | None, url: str, *, fetch: Fetch | None = None,
               contexts: dict[str, Any] | None = None) -> Graph:
    """One page as a graph (relative IRIs resolved against ``url``). Without a known format, RDF/XML,
    Turtle and JSON-LD are tried in turn. Remote JSON-LD contexts are fetched with ``fetch`` (an
    error without it) and kept in ``contexts``."""
    fmt = rdf_format(content_type, url)
    tries = (fmt,) if fmt else _GUESS_ORDER
    errors = []
    for candidate in tries:
        try:
            graph = _parse_as(body, candidate, url, fetch, contexts if contexts is not None else {})
        except (SourceError, RdfParseError):
            raise
        except Exception as exc:  # rdflib raises many kinds (SAXParseException, BadSyntax, ...)
            errors.append(f"{candidate}: {type(exc).__name__}: {_shorten(str(exc))}")
            continue
        if _is_catalogue(graph):
            return graph
        errors.append(f"{candidate}: {len(graph)} statements, none of them DCAT or Hydra")
    raise RdfParseError(f"{scrub_url(url)}: not readable as a DCAT catalogue ({'; '.join(errors)})")


def _is_catalogue(graph: Graph) -> bool:
    """Whether the graph says anything in DCAT or Hydra terms. RDF/XML parsers read any XML (an
    HTML error page becomes a few meaningless statements): such a page must not pass for an empty
    catalogue."""
    namespaces = (str(DCAT), *(str(ns) for ns in HYDRA_NAMESPACES))
    return any(str(p).startswith(namespaces) or (p == RDF.type and str(o).startswith(namespaces))
               for _, p, o in graph)


_NORMALIZE_LOCK = threading.Lock()


@contextmanager
def _lexical_forms_as_written() -> Iterator[None]:
    """rdflib rewrites the lexical form of every literal it can read as its datatype (by default, a
    process-wide switch): "1994-01-01 00:00:00" becomes "1994-01-01T00:00:00", an xsd:date
    "2006-11-21T01:02:03" loses its time. Off while we parse, so values stay as the portal wrote them."""
    with _NORMALIZE_LOCK:
        before = rdflib.NORMALIZE_LITERALS
        rdflib.NORMALIZE_LITERALS = False
        try:
            yield
        finally:
            rdflib.NORMALIZE_LITERALS = before


def _parse_as(body: bytes, fmt: str, url: str, fetch: Fetch | None, contexts: dict[str, Any]) -> Graph:
    graph = Graph()
    args: dict[str, Any] = {}
    if fmt == "json-ld":
        document = _json_document(body, url, "the page")
        data: str | bytes = json.dumps(_inline_contexts(document, url, fetch, contexts))
    else:
        data = body
        if fmt == "xml":
            args["text_limit"] = _MAX_XML_TEXT_FACTOR * len(body) + _MAX_XML_TEXT_EXTRA
    try:
        with _lexical_forms_as_written():
            graph.parse(data=data, format=_PARSERS.get(fmt, fmt), publicID=url, **args)
    except RdfParseError as exc:  # refused by our parsers or by the loaders rdflib must not reach
        raise RdfParseError(f"{scrub_url(url)}: {exc}") from None
    except RecursionError:
        raise RdfParseError(f"{scrub_url(url)}: {fmt}: nested too deeply to read (over Python's recursion "
                            "limit)") from None
    return graph


def _json_document(body: bytes | str, url: str, what: str) -> Any:
    """The JSON of ``body``; RdfParseError when it nests deeper than ``_MAX_JSON_DEPTH`` (rdflib's
    JSON-LD parser and our context walk recurse once a level or more)."""
    try:
        document = json.loads(body)
    except RecursionError:
        raise RdfParseError(f"{scrub_url(url)}: {what} nests JSON deeper than Python can read") from None
    stack = [(document, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > _MAX_JSON_DEPTH:
            raise RdfParseError(f"{scrub_url(url)}: {what} nests JSON more than {_MAX_JSON_DEPTH} levels deep")
        if isinstance(node, dict):
            stack.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node)
    return document


def _inline_contexts(document: Any, url: str, fetch: Fetch | None, contexts: dict[str, Any]) -> Any:
    """The JSON-LD document with every remote context replaced by its content, at any depth: a
    ``@context`` string or list of them (in the document, in a fetched context, in a scoped context
    of a term definition), and ``@import``. Each is fetched with ``fetch`` (once per listing: kept in
    ``contexts``); one that is not http(s) (file:, data:, ftp:, a relative reference against an
    upload), that includes itself, nests more than ``_MAX_CONTEXT_DEPTH`` remote contexts deep, would
    be the ``_MAX_CONTEXT_FETCHES``+1st fetch of the page, or would make the page's inlined contexts
    larger than ``_MAX_INLINED_CONTEXT_BYTES`` is refused (RdfParseError naming it), never opened.
    What comes out names no remote context, so rdflib has nothing to open."""
    page = scrub_url(url)
    fetched = [0]
    inlined = [0]
    sizes: dict[str, int] = {}
    active: list[str] = []  # the remote contexts being inlined, to stop one that includes itself

    def remote(ref: str, base: str) -> Any:
        target = urljoin(base, ref)
        where = f"{page}: remote JSON-LD context {scrub_url(target)!r}"
        if urlsplit(target).scheme.lower() not in ("http", "https"):
            raise RdfParseError(f"{where} is not an http(s) URL: refused, never opened")
        if target in active:
            raise RdfParseError(f"{where} includes itself (through {' -> '.join(map(scrub_url, active))})")
        if len(active) >= _MAX_CONTEXT_DEPTH:
            raise RdfParseError(f"{where}: remote contexts nested more than {_MAX_CONTEXT_DEPTH} deep "
                                f"({' -> '.join(map(scrub_url, active))})")
        if target not in contexts:
            if fetch is None:
                raise RdfParseError(f"{where} (nothing to fetch it with)")
            if fetched[0] >= _MAX_CONTEXT_FETCHES:
                raise RdfParseError(f"{where}: more than {_MAX_CONTEXT_FETCHES} remote contexts in one page")
            fetched[0] += 1
            contexts[target] = _fetch_context(target, url, fetch)
        if target not in sizes:
            sizes[target] = len(json.dumps(contexts[target]))
        inlined[0] += sizes[target]
        if inlined[0] > _MAX_INLINED_CONTEXT_BYTES:
            raise RdfParseError(f"{where}: the page's remote contexts, inlined where it names them, would come "
                                f"to more than {_MAX_INLINED_CONTEXT_BYTES // (1024 * 1024)} MB")
        active.append(target)
        try:
            value = context(contexts[target], target)
        finally:
            active.pop()
        # A remote context's @base is ignored (JSON-LD 1.1, Context Processing 5.7; rdflib too)
        if isinstance(value, dict):
            return {k: v for k, v in value.items() if k != "@base"}
        if isinstance(value, list):
            return [{k: v for k, v in item.items() if k != "@base"} if isinstance(item, dict) else item
                    for item in value]
        return value

    def context(value: Any, base: str) -> Any:
        """A context value (string, list, map or null) with nothing remote left in it."""
        if isinstance(value, str):
            return remote(value, base)
        if isinstance(value, list):
            out: list = []
            for item in value:
                got = context(item, base)
                out.extend(got if isinstance(got, list) else [got])
            return out
        if not isinstance(value, dict):
            return value
        local = dict(value)
        if "@import" in local:
            ref = local.pop("@import")
            if not isinstance(ref, str):
                raise RdfParseError(f"{page}: @import {str(ref)[:100]!r} is not a URL")
            imported = remote(ref, base)
            if not isinstance(imported, dict):
                raise RdfParseError(f"{page}: @import {scrub_url(urljoin(base, ref))!r} is not a single context")
            local = {**imported, **local}
            local.pop("@base", None)  # (rdflib ignores @base in a context that imports)
        for key, definition in local.items():
            if isinstance(definition, dict) and "@context" in definition:  # a scoped context
                local[key] = {**definition, "@context": context(definition["@context"], base)}
        return local

    def walk(node: Any) -> Any:
        if isinstance(node, list):
            return [walk(v) for v in node]
        if not isinstance(node, dict):
            return node
        out = {k: (v if k == "@value" else walk(v)) for k, v in node.items() if k != "@context"}
        if "@context" in node:
            out["@context"] = context(node["@context"], url)
        return out

    return walk(document)


def _fetch_context(target: str, url: str, fetch: Fetch) -> Any:
    try:
        body, _ = fetch(target)
    except SourceError:
        raise
    except Exception as exc:
        raise RdfParseError(f"{scrub_url(url)}: remote JSON-LD context {scrub_url(target)}: "
                            f"{type(exc).__name__}: {_shorten(str(exc))}") from exc
    try:
        document = _json_document(body, url, f"remote JSON-LD context {scrub_url(target)}")
    except RdfParseError:
        raise
    except Exception as exc:
        raise RdfParseError(f"{scrub_url(url)}: remote JSON-LD context {scrub_url(target)}: "
                            f"{type(exc).__name__}: {_shorten(str(exc))}") from exc
    if not isinstance(document, dict) or "@context" not in document:
        raise RdfParseError(f"{scrub_url(url)}: remote JSON-LD context {scrub_url(target)} has no @context")
    return document["@context"]


def _shorten(text: str, limit: int = 400) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "..."


# -- rdflib's parsers, bounded -------------------------------------------------------------------
# rdflib's own parsers with their super-linear parts replaced (text accumulated in lists, joined
# once) and the RDF/XML reader closed to anything outside the document. Registered as rdflib plugins
# under names of their own (``_PARSERS``): rdflib's stay as they are for anyone else in the process.
def _no_remote_context(source: Any, *args: Any, **kwargs: Any) -> Any:
    """Stands for rdflib's JSON-LD context loader (``source_to_json`` as the context module calls it
    for a context string and ``@import``): Harvester inlines every remote context first, so reaching
    this is a bug, refused before anything is opened."""
    raise RdfParseError(f"rdflib tried to open {str(source)[:200]!r} itself: remote contexts are fetched only "
                        "through Harvester's guarded client")


_jsonld_context.source_to_json = _no_remote_context


class _LinearSinkParser(SinkParser):
    """rdflib's Turtle/N3 parser, but for string constants: rdflib's ``strconst`` appends to one
    string piece by piece (a literal of a million lines took 46 s); this one collects the pieces in
    a list and joins them once. Same values, same errors."""

    def strconst(self, argstr: str, i: int, delim: str) -> tuple[int, str]:
        delim1 = delim[0]
        delim2, delim3, delim4, delim5 = delim1 * 2, delim1 * 3, delim1 * 4, delim1 * 5
        j = i
        parts: list[str] = []
        startline = self.lines
        len_argstr = len(argstr)
        while j < len_argstr:
            if argstr[j] == delim1:
                if delim == delim1:
                    return j + 1, "".join(parts)
                if delim == delim3:
                    if argstr[j: j + 5] == delim5:
                        parts.append(delim2)
                        return j + 5, "".join(parts)
                    if argstr[j: j + 4] == delim4:
                        parts.append(delim1)
                        return j + 4, "".join(parts)
                    if argstr[j: j + 3] == delim3:
                        return j + 3, "".join(parts)
                    j += 1
                    parts.append(delim1)
                    continue
            m = _N3_INTERESTING.search(argstr, j)
            assert m, "Quote expected in string at ^ in %s^%s" % (argstr[j - 20: j], argstr[j: j + 20])
            i = m.start()
            parts.append(argstr[j:i])
            ch = argstr[i]
            if ch == delim1:
                j = i
                continue
            elif ch in {'"', "'"} and ch != delim1:
                parts.append(ch)
                j = i + 1
                continue
            elif ch in {"\r", "\n"}:
                if delim == delim1:
                    raise N3BadSyntax(self._thisDoc, startline, argstr, i, "newline found in string literal")
                self.lines += 1
                parts.append(ch)
                j = i + 1
                self.startOfLine = j
            elif ch == "\\":
                j = i + 1
                ch = argstr[j]
                if not ch:
                    raise N3BadSyntax(self._thisDoc, startline, argstr, i, "unterminated string literal (2)")
                k = "abfrtvn\\\"'".find(ch)
                if k >= 0:
                    parts.append("\a\b\f\r\t\v\n\\\"'"[k])
                    j += 1
                elif ch == "u":
                    j, ch = self.uEscape(argstr, j + 1, startline)
                    parts.append(ch)
                elif ch == "U":
                    j, ch = self.UEscape(argstr, j + 1, startline)
                    parts.append(ch)
                else:
                    self.BadSyntax(argstr, i, "bad escape")
        self.BadSyntax(argstr, i, "unterminated string literal")


class _TurtleParser(TurtleParser):
    """rdflib's Turtle parser (``TurtleParser.parse``) on ``_LinearSinkParser``."""

    def parse(self, source, graph, encoding: str | None = "utf-8", turtle: bool = True) -> None:
        if encoding not in (None, "utf-8"):
            raise rdflib.exceptions.ParserError(f"N3/Turtle files are always utf-8 encoded, I was passed: {encoding}")
        sink = N3RDFSink(graph)
        base = graph.absolutize(source.getPublicId() or source.getSystemId() or "")
        parser = _LinearSinkParser(sink, baseURI=base, turtle=turtle)
        parser.loadStream(source.getCharacterStream() or source.getByteStream())
        for prefix, namespace in parser._bindings.items():
            graph.bind(prefix, namespace)


class _N3Parser(_TurtleParser):
    """rdflib's N3 parser (``N3Parser.parse``) on ``_LinearSinkParser``."""

    def parse(self, source, graph, encoding: str | None = "utf-8", turtle: bool = False) -> None:
        if not getattr(graph.store, "context_aware", False) or not getattr(graph.store, "formula_aware", False):
            raise rdflib.exceptions.ParserError("Cannot parse N3 into a store that is not context- and formula-aware.")
        conj_graph = rdflib.Dataset(store=graph.store)
        conj_graph.default_context = graph
        conj_graph.namespace_manager = graph.namespace_manager
        super().parse(source, conj_graph, encoding, turtle=False)


class _LineReader(W3CNTriplesParser):
    """rdflib's N-Triples parser reading its lines from the whole text (in memory already): rdflib's
    reads 2 kB at a time and matches a line from its start again after each read (a 2 MB line:
    quadratic). Lines end as rdflib's end them (CRLF, CR or LF; the last one needs none)."""

    __slots__ = ("_whole", "_at")

    def readline(self) -> str | None:
        if not hasattr(self, "_whole"):
            self._whole, self._at = self.file.read(), 0  # type: ignore[union-attr]
        m = _NT_LINE.match(self._whole, self._at)
        if m:
            self._at = m.end()
            return m.group(1)
        rest = self._whole[self._at:]
        self._at = len(self._whole)
        return None if not rest or rest.isspace() else rest


class _NTriplesParser(NTParser):
    """rdflib's N-Triples parser (``NTParser.parse``) on ``_LineReader``."""

    @classmethod
    def parse(cls, source, sink, **kwargs: Any) -> None:
        stream = source.getCharacterStream()
        if not stream:
            stream = source.getByteStream()
            if not isinstance(stream, io.TextIOBase):
                stream = codecs.getreader("utf-8")(stream)
        _LineReader(NTGraphSink(sink)).parse(stream, **kwargs)
        stream.close()


class _Markup(list):
    """The markup of an ``rdf:parseType="Literal"`` property, in pieces, ``start`` the literal
    rdflib begins it with (its text is added to that once, at the end, instead of piece by piece:
    each ``Literal +`` parsed the whole XML written so far again)."""

    def __init__(self, start: Literal):
        super().__init__()
        self.start = start

    def literal(self) -> Literal:
        return self.start + "".join(self) if self else self.start


class _RdfXmlHandler(RDFXMLHandler):
    """rdflib's RDF/XML handler, but linear: a property's text and a literal's markup are collected
    in lists and joined once (rdflib appends to a string attribute piece by piece: a literal of a
    million lines took 136 s), and the text the document expands to (entities included) is capped
    at ``text_limit`` characters."""

    def __init__(self, store: Graph, text_limit: int | None):
        super().__init__(store)
        self.text_limit = text_limit

    def reset(self) -> None:
        super().reset()
        self._text_of: Any = None
        self._text: list[str] = []
        self._expanded = 0

    def _count(self, n: int) -> None:
        self._expanded += n
        if self.text_limit is not None and self._expanded > self.text_limit:
            raise RdfParseError(f"the document expands to more than {self.text_limit} characters of text "
                                "(entities repeated): refused")

    def _flush_text(self) -> None:
        owner = self._text_of
        if owner is not None:
            if owner.data is not None:
                owner.data += "".join(self._text)
            self._text_of, self._text = None, []

    def characters(self, content: str) -> None:
        self._count(len(content))
        super().characters(content)

    def startElementNS(self, name, qname, attrs) -> None:
        self._count(sum(len(v) for v in attrs.values()))
        self._flush_text()
        super().startElementNS(name, qname, attrs)

    def endElementNS(self, name, qname) -> None:
        self._flush_text()
        super().endElementNS(name, qname)

    def property_element_char(self, data: str) -> None:
        current = self.current
        if current.data is not None:
            if self._text_of is not current:
                self._flush_text()
                self._text_of = current
            self._text.append(data)

    def property_element_start(self, name, qname, attrs) -> None:
        super().property_element_start(name, qname, attrs)
        current = self.current
        if current.char == self.literal_element_char and isinstance(current.object, Literal):
            current.object = _Markup(current.object)

    def property_element_end(self, name, qname) -> None:
        current = self.current
        if isinstance(current.object, _Markup):
            current.object = current.object.literal()
        super().property_element_end(name, qname)

    def literal_element_start(self, name, qname, attrs) -> None:
        current = self.current
        self.next.start = self.literal_element_start
        self.next.char = self.literal_element_char
        self.next.end = self.literal_element_end
        current.declared = self.parent.declared.copy()
        markup: list[str] = []
        if name[0]:
            prefix = self._current_context[name[0]]
            markup.append(f"<{prefix}:{name[1]}" if prefix else f"<{name[1]}")
            if name[0] not in current.declared:
                current.declared[name[0]] = prefix
                markup.append(f' xmlns:{prefix}="{name[0]}"' if prefix else f' xmlns="{name[0]}"')
        else:
            markup.append(f"<{name[1]}")
        for att, value in attrs.items():
            if att[0]:
                if att[0] not in current.declared:
                    current.declared[att[0]] = self._current_context[att[0]]
                att_name = current.declared[att[0]] + ":" + att[1]
            else:
                att_name = att[1]
            markup.append(f" {att_name}={quoteattr(value)}")
        markup.append(">")
        current.object = markup

    def literal_element_char(self, data: str) -> None:
        self.current.object.append(xml_escape(data))

    def literal_element_end(self, name, qname) -> None:
        if name[0]:
            prefix = self._current_context[name[0]]
            end = f"</{prefix}:{name[1]}>" if prefix else f"</{name[1]}>"
        else:
            end = f"</{name[1]}>"
        self.parent.object.extend(self.current.object)
        self.parent.object.append(end)


class _ExpatReader(ExpatParser):
    """Python's expat SAX reader (named, not picked by ``make_parser``, which PY_SAX_PARSER could
    steer), closed to everything outside the document: no external DTD or parameter entity is read,
    an external entity is refused; an entity declaration is refused unless it is plain text (no
    reference to another entity, no markup) of at most ``_MAX_XML_ENTITY_CHARS`` characters, which
    is what RDF/XML writers declare (``<!ENTITY xsd "http://www.w3.org/2001/XMLSchema#">``); text
    comes in 64 kB runs."""

    def reset(self) -> None:
        super().reset()
        self._parser.SetParamEntityParsing(pyexpat.XML_PARAM_ENTITY_PARSING_NEVER)
        self._parser.EntityDeclHandler = self._entity_declared
        self._parser.buffer_text = True
        self._parser.buffer_size = 64 * 1024

    def _entity_declared(self, name, is_parameter, value, base, system_id, public_id, notation) -> None:
        if is_parameter:
            raise RdfParseError(f"the document declares the parameter entity %{name}: refused (RDF/XML pages "
                                "may declare only plain internal entities)")
        if value is None:
            raise RdfParseError(f"the document declares the external entity {name} (SYSTEM {system_id!r}): "
                                "refused, never opened")
        if "&" in value or "<" in value:
            raise RdfParseError(f"the document declares the entity {name} with a reference or markup in it "
                                f"({value[:100]!r}): refused (nested entities expand a small document into gigabytes)")
        if len(value) > _MAX_XML_ENTITY_CHARS:
            raise RdfParseError(f"the document declares the entity {name} of {len(value)} characters: refused "
                                f"(at most {_MAX_XML_ENTITY_CHARS})")

    def external_entity_ref(self, context, base, sysid, pubid):
        raise RdfParseError(f"the document refers to the external entity {sysid!r}: refused, never opened")


class _RdfXmlParser(RDFXMLParser):
    """rdflib's RDF/XML parser on ``_ExpatReader`` and ``_RdfXmlHandler`` (``text_limit``: see there)."""

    def parse(self, source, sink, text_limit: int | None = None, **args: Any) -> None:
        reader = _ExpatReader()
        reader.setFeature(xml.sax.handler.feature_namespaces, 1)
        reader.setFeature(xml.sax.handler.feature_external_ges, 0)
        reader.setFeature(xml.sax.handler.feature_external_pes, 0)
        reader.start_namespace_decl("xml", "http://www.w3.org/XML/1998/namespace")
        handler = _RdfXmlHandler(sink, text_limit)
        handler.setDocumentLocator(source)
        if args.get("preserve_bnode_ids") is not None:
            handler.preserve_bnode_ids = args["preserve_bnode_ids"]
        reader.setContentHandler(handler)
        reader.setErrorHandler(xml.sax.handler.ErrorHandler())
        reader.parse(source)


_PARSERS = {"xml": "harvester-rdf-xml", "turtle": "harvester-turtle", "n3": "harvester-n3",
            "nt": "harvester-nt"}
for _fmt, _name in _PARSERS.items():
    rdflib.plugin.register(_name, rdflib.parser.Parser, __name__,
                           {"xml": "_RdfXmlParser", "turtle": "_TurtleParser", "n3": "_N3Parser",
                            "nt": "_NTriplesParser"}[_fmt])


# -- literals and nodes ------------------------------------------------------------------------
def _lang(literal: Literal) -> str:
    return (literal.language or "").lower()


def _literals(graph: Graph, node: Any, predicate: URIRef) -> list[Literal]:
    return sorted((o for o in graph.objects(node, predicate) if isinstance(o, Literal)),
                  key=lambda lit: (_lang(lit), str(lit)))


def pick_language(literals: Iterable[Literal], language: str | None) -> Literal | None:
    """The literal in ``language`` (an ISO 639-1 code; "de" also takes "de-CH"), else English, else
    untagged, else the first in (tag, text) order."""
    ordered = sorted(literals, key=lambda lit: (_lang(lit), str(lit)))
    if not ordered:
        return None
    for wanted in ([language.lower()] if language else []) + ["en"]:
        for exact in (True, False):
            for lit in ordered:
                tag = _lang(lit)
                if tag == wanted if exact else tag.split("-")[0] == wanted:
                    return lit
    untagged = [lit for lit in ordered if not lit.language]
    return (untagged or ordered)[0]


def _text(graph: Graph, node: Any, predicate: URIRef, language: str | None) -> str | None:
    lit = pick_language(_literals(graph, node, predicate), language)
    return str(lit) if lit is not None else None


def _by_language(literals: Iterable[Literal]) -> dict[str, str]:
    """One text per language tag ("" for untagged): the first in sorted order when several."""
    out: dict[str, str] = {}
    for lit in sorted(literals, key=lambda lit: (_lang(lit), str(lit))):
        out.setdefault(_lang(lit), str(lit))
    return out


def _values(graph: Graph, node: Any, predicate: URIRef) -> list[str]:
    """The predicate's objects as strings (IRIs and lexical forms; blank nodes left out), sorted."""
    return sorted({str(o) for o in graph.objects(node, predicate) if not isinstance(o, BNode)})


def _is_http(value: str | None) -> bool:
    return bool(value) and urlsplit(value).scheme.lower() in ("http", "https")


def _first_url(values: list[str]) -> str | None:
    """The first http(s) value, else the first value."""
    return next((v for v in values if _is_http(v)), values[0] if values else None)


def _compact(iri: str) -> str:
    for namespace, prefix in _PREFIXES.items():
        if iri.startswith(namespace) and len(iri) > len(namespace):
            return f"{prefix}:{iri[len(namespace):]}"
    return iri


def _iri_tail(value: str) -> str:
    return re.split(r"[/#]", value.rstrip("/#"))[-1] or value


def _sort_key(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)


def _plain(values: list[Any]) -> Any:
    values = sorted(values, key=_sort_key)
    return values[0] if len(values) == 1 else values


def _node_value(graph: Graph, node: Any, depth: int, expand_iri: bool = False) -> Any:
    """A node as JSON: literals by their lexical form, IRIs as strings, blank nodes (and, with
    ``expand_iri``, described IRIs) as dicts of their properties, ``depth`` levels deep."""
    if isinstance(node, Literal):
        return str(node)
    described = isinstance(node, BNode) or (expand_iri and (node, None, None) in graph)
    if not described:
        return str(node)
    if depth <= 0:
        return {} if isinstance(node, BNode) else str(node)
    props = _properties(graph, node, depth - 1, skip=frozenset())
    return props if isinstance(node, BNode) else {"@id": str(node), **props}


def _properties(graph: Graph, node: Any, depth: int, skip: frozenset) -> dict[str, Any]:
    grouped: dict[str, list[Any]] = {}
    for predicate, obj in graph.predicate_objects(node):
        if predicate in skip:
            continue
        value = _node_value(graph, obj, depth, expand_iri=predicate in _EXPANDED)
        grouped.setdefault(_compact(str(predicate)), []).append(value)
    return {key: _plain(values) for key, values in sorted(grouped.items())}


# -- the mapping -------------------------------------------------------------------------------
def _organization(graph: Graph, dataset: Any, language: str | None) -> dict | None:
    publishers = sorted(graph.objects(dataset, DCTERMS.publisher), key=lambda p: (isinstance(p, BNode), str(p)))
    if not publishers:
        return None
    publisher = publishers[0]
    if isinstance(publisher, Literal):
        title = str(publisher)
    else:
        names = [lit for p in (FOAF.name, VCARD.fn, VCARD["organization-name"], SKOS.prefLabel, RDFS.label)
                 for lit in _literals(graph, publisher, p)]
        lit = pick_language(names, language)
        title = str(lit) if lit is not None else (str(publisher) if isinstance(publisher, URIRef) else None)
    shown = clean_text(title)
    if not shown:
        return None
    org = {"title": shown, "name": slug(title)}
    if isinstance(publisher, URIRef):
        org["id"] = str(publisher)
    return org


def _format(graph: Graph, distribution: Any) -> tuple[str, str]:
    """(format, media type) of a distribution. The format is dct:format (an IRI's last segment, a
    described node's label, a literal as written), else the media type's subtype ("text/csv" -> "csv")."""
    def label(node: Any) -> str:
        if isinstance(node, BNode):
            for predicate in (RDFS.label, SKOS.prefLabel, RDF.value):
                lit = pick_language(_literals(graph, node, predicate), None)
                if lit is not None:
                    return str(lit).strip()
            return ""
        return str(node).strip()

    def first(predicate: URIRef) -> str:
        found = sorted(filter(None, (label(o) for o in graph.objects(distribution, predicate))))
        return found[0] if found else ""

    media_type = first(DCAT.mediaType)
    if "/media-types/" in media_type:  # an IANA IRI
        media_type = media_type.split("/media-types/", 1)[1]
    fmt = first(DCTERMS.format)
    if fmt and ("/" in fmt or "#" in fmt):  # an IRI, or a media type written as the format
        fmt = _iri_tail(fmt)
    return fmt or (_iri_tail(media_type) if media_type else ""), media_type


def _resources(graph: Graph, dataset: Any, language: str | None) -> list[dict]:
    resources = []
    for distribution in graph.objects(dataset, DCAT.distribution):
        url = (_first_url(_values(graph, distribution, DCAT.downloadURL))
               or _first_url(_values(graph, distribution, DCAT.accessURL))
               or (str(distribution) if isinstance(distribution, URIRef) else ""))
        fmt, media_type = _format(graph, distribution)
        resource = {"url": url, "format": fmt, "name": clean_text(_text(graph, distribution, DCTERMS.title, language)),
                    "description": clean_text(_text(graph, distribution, DCTERMS.description, language)),
                    "mimetype": media_type, "license": _first_url(_values(graph, distribution, DCTERMS.license))}
        if isinstance(distribution, URIRef):
            resource["id"] = str(distribution)
        resources.append(resource)
    return sorted(resources, key=lambda r: (r["url"], r["format"], r["name"], r.get("id", "")))


def _licenses(graph: Graph, dataset: Any) -> list[str]:
    """The dataset's licences (IRIs first), else its distributions'."""
    own = _values(graph, dataset, DCTERMS.license)
    if not own:
        own = sorted({v for d in graph.objects(dataset, DCAT.distribution) for v in _values(graph, d, DCTERMS.license)})
    return sorted(own, key=lambda v: (not _is_http(v), v))


def _modified(graph: Graph, dataset: Any) -> str | None:
    """dct:modified of the dataset, else of the catalogue record about it (the lexical form)."""
    values = _values(graph, dataset, DCTERMS.modified)
    if not values:
        values = sorted({v for record in graph.subjects(FOAF.primaryTopic, dataset)
                         for v in _values(graph, record, DCTERMS.modified)})
    return values[-1] if values else None


def _identity(graph: Graph, dataset: Any, landing: str | None) -> str | None:
    if isinstance(dataset, URIRef):
        return str(dataset)
    identifiers = [v.strip() for v in _values(graph, dataset, DCTERMS.identifier) if v.strip()]
    if identifiers:
        return identifiers[0]
    if landing:
        return "landing:" + sha256_hex(normalize_url(landing))[:32]
    return None


def _failed(graph: Graph, dataset: Any, dataset_id: str | None, title: str | None, problems: list[Problem],
            catalog_url: str, source_id: str | None = None) -> DatasetRecord:
    raw = {"id": dataset_id, "title": title, "catalog": catalog_url,
           "properties": _properties(graph, dataset, _NODE_DEPTH, skip=frozenset())}
    return failed(source_id, raw, problems)


# -- validation (DCAT-AP 3.0 by rules; see the module docstring) -----------------------------------
def _is_date(text: str) -> bool:
    """A lexical form readable as xsd:dateTime or xsd:date (or, lower precision, xsd:gYear / gYearMonth)."""
    text = text.strip()
    if parse_timestamp(text) is not None:
        return True
    parts = text.split("-")
    return 1 <= len(parts) <= 2 and all(p.isdigit() for p in parts) and len(parts[0]) == 4 and (
        len(parts) == 1 or (len(parts[1]) == 2 and 1 <= int(parts[1]) <= 12))


def _kind(node: Any) -> str:
    return "a literal" if isinstance(node, Literal) else "a blank node" if isinstance(node, BNode) else "an IRI"


def _date_problems(values: list[tuple[str, Any]], bad_code: str,
                   skip: str | None) -> tuple[list[Problem], list[Problem]]:
    """(errors, warnings) of date values ``(field, node)``: a non-date is ``bad_code`` (its severity
    decides the list), an empty literal ``range-tolerated``. ``skip``: a value already reported by
    the content warnings (domain/quality.py reads the package's ``issued``)."""
    errors: list[Problem] = []
    warnings: list[Problem] = []
    for field, node in values:
        text = str(node)
        if isinstance(node, Literal) and not text.strip():
            warnings.append(problem("range-tolerated", f"{field} is an empty literal, read as no date", field, text))
        elif not isinstance(node, Literal) or not _is_date(text):
            if skip is not None and text == skip:
                continue
            found = problem(bad_code, f"{field} {text[:100]!r} is not an xsd:date or xsd:dateTime"
                            + ("" if isinstance(node, Literal) else f" but {_kind(node)}"), field, text)
            (errors if found.severity == ERROR else warnings).append(found)
    return errors, warnings


def _distribution_labels(graph: Graph, distributions: list[Any]) -> list[tuple[Any, str]]:
    """Each distribution with the label a field names it by: its IRI, or (a blank node) its position
    among the blank ones ordered by what they say, so the label is the same at every parse."""
    iris = sorted((d for d in distributions if not isinstance(d, BNode)), key=str)
    blanks = sorted((d for d in distributions if isinstance(d, BNode)),
                    key=lambda d: sorted((str(p), str(o)) for p, o in graph.predicate_objects(d)
                                         if not isinstance(o, BNode)))
    return [(d, str(d)) for d in iris] + [(d, str(n)) for n, d in enumerate(blanks)]


def validate(graph: Graph, dataset: Any, issued: str | None = None) -> tuple[list[Problem], list[Problem]]:
    """The DCAT-AP rules past identity and title (module docstring): (errors, warnings) of one
    ``dcat:Dataset`` node. ``issued``: the package's ``issued``, whose being no date the content
    warnings report already."""
    errors: list[Problem] = []
    warnings: list[Problem] = []
    objects = {p: list(graph.objects(dataset, p)) for p in (
        DCTERMS.modified, DCTERMS.issued, DCAT.distribution, DCTERMS.publisher, DCAT.contactPoint,
        DCAT.landingPage, DCAT.keyword, DCAT.theme)}

    modified = [("dct:modified", o) for o in objects[DCTERMS.modified]]
    if not modified:  # the catalogue record's, as _modified reads it
        modified = [("dcat:CatalogRecord.dct:modified", o) for record in graph.subjects(FOAF.primaryTopic, dataset)
                    for o in graph.objects(record, DCTERMS.modified)]
    bad, tolerated = _date_problems(modified, "bad-range", None)
    errors += bad
    warnings += tolerated
    bad, tolerated = _date_problems([("dct:issued", o) for o in objects[DCTERMS.issued]], "bad-optional-date",
                                    issued if issued and issued.strip() else None)
    warnings += bad + tolerated

    for predicate, field in ((DCAT.distribution, "dcat:distribution"), (DCTERMS.publisher, "dct:publisher"),
                             (DCAT.contactPoint, "dcat:contactPoint")):
        for node in objects[predicate]:
            if isinstance(node, Literal):
                errors.append(problem("bad-range", f"{field} {str(node)[:100]!r} is a literal, not a resource",
                                      field, str(node)))
    for node in objects[DCAT.landingPage]:
        if not isinstance(node, URIRef):
            warnings.append(problem("range-tolerated", f"dcat:landingPage {str(node)[:100]!r} is {_kind(node)}, "
                                                       "not an IRI", "dcat:landingPage", str(node)))
    for node in objects[DCAT.theme]:
        if isinstance(node, Literal):
            warnings.append(problem("range-tolerated", f"dcat:theme {str(node)[:100]!r} is a literal, not a resource",
                                    "dcat:theme", str(node)))
    for node in objects[DCAT.keyword]:
        if not isinstance(node, Literal):
            warnings.append(problem("range-tolerated", f"dcat:keyword {str(node)[:100]!r} is {_kind(node)}, not a "
                                                       "literal (left out of the tags)", "dcat:keyword", str(node)))
    for predicate, field in ((DCTERMS.publisher, "dct:publisher"), (DCAT.contactPoint, "dcat:contactPoint")):
        if not objects[predicate]:
            warnings.append(problem("recommended-missing", f"the dataset has no {field} (recommended by DCAT-AP)",
                                    field))

    resources = [d for d in objects[DCAT.distribution] if not isinstance(d, Literal)]
    for distribution, label in _distribution_labels(graph, resources):
        field = f"dcat:distribution[{label}].dcat:accessURL"
        urls = list(graph.objects(distribution, DCAT.accessURL))
        if not urls:
            warnings.append(problem("distribution-incomplete", f"distribution {label} has no dcat:accessURL "
                                                               "(mandatory in DCAT-AP)", field))
        for node in urls:
            if not isinstance(node, URIRef):
                warnings.append(problem("range-tolerated", f"{field} {str(node)[:100]!r} of distribution {label} is "
                                                           f"{_kind(node)}, not an IRI", field, str(node)))
    return errors, warnings


def record_from_node(graph: Graph, dataset: Any, catalog_url: str, language: str | None) -> DatasetRecord:
    """One ``dcat:Dataset`` node as a record: failed, with its coded problems, when it has no identity
    or title or breaks a DCAT-AP rule of severity error (``validate``)."""
    titles = _literals(graph, dataset, DCTERMS.title)
    descriptions = _literals(graph, dataset, DCTERMS.description)
    description_predicate = DCTERMS.description
    if not descriptions and (dataset, DCTERMS.abstract, None) in graph:
        descriptions, description_predicate = _literals(graph, dataset, DCTERMS.abstract), DCTERMS.abstract
    title_lit = pick_language(titles, language)
    landing = _first_url(_values(graph, dataset, DCAT.landingPage))
    dataset_id = _identity(graph, dataset, landing)
    title = clean_text(title_lit) if title_lit is not None else ""
    if dataset_id is None:
        return _failed(graph, dataset, None, title or None, [problem(
            "no-identifier", f"dataset {title or '(untitled)'!r} has no IRI, dct:identifier or dcat:landingPage",
            "dct:identifier")], catalog_url)
    if not title:
        given = next(iter(sorted(graph.objects(dataset, DCTERMS.title), key=str)), None)
        return _failed(graph, dataset, dataset_id, None, [problem(
            "no-title", f"dataset {dataset_id!r} has no dct:title" + (
                "" if given is None else f" ({_kind(given)} {str(given)[:100]!r} gives no text)"),
            "dct:title", None if given is None else str(given))], catalog_url)
    issued = (_values(graph, dataset, DCTERMS.issued) or [None])[0]
    errors, warnings = validate(graph, dataset, issued)
    if errors:
        return _failed(graph, dataset, dataset_id, str(title_lit), errors, catalog_url, source_id=dataset_id)

    description_lit = pick_language(descriptions, language)
    keywords = _literals(graph, dataset, DCAT.keyword)
    licenses = _licenses(graph, dataset)
    modified = _modified(graph, dataset)
    extras = _properties(graph, dataset, _NODE_DEPTH, skip=_MAPPED | {description_predicate})
    if len(licenses) > 1:
        extras["dct:license"] = licenses
    tags = sorted({str(k).strip() for k in keywords if str(k).strip()})
    keywords_by_language: dict[str, list[str]] = {}
    for k in keywords:
        keywords_by_language.setdefault(_lang(k), []).append(str(k).strip())
    package = {
        "id": dataset_id,
        "title": str(title_lit),
        "notes": str(description_lit) if description_lit is not None else "",
        "url": landing,
        "issued": issued,
        "metadata_modified": modified,
        "license_id": licenses[0] if licenses else None,
        "organization": _organization(graph, dataset, language),
        "tags": [{"name": t} for t in tags],
        "groups": [{"name": g} for g in _values(graph, dataset, DCAT.theme)],
        "resources": _resources(graph, dataset, language),
        "extras": [{"key": k, "value": v} for k, v in sorted(extras.items())],
        "translations": {"title": _by_language(titles), "description": _by_language(descriptions),
                         "keywords": {lang: sorted(set(ks)) for lang, ks in sorted(keywords_by_language.items())}},
    }
    description = clean_text(package["notes"])
    url = landing if _is_http(landing) else dataset_id if _is_http(dataset_id) else f"{catalog_url}#{dataset_id}"
    # the language of the title shown (its xml:lang) is the record's: its text is indexed in it
    return package_record(package, source_id=dataset_id, url=url, title=title, description=description, tags=tags,
                          organization=(package["organization"] or {}).get("title"), warnings=tuple(warnings),
                          language=_lang(title_lit) or None)


def records_from_graph(graph: Graph, catalog_url: str, language: str | None) -> list[DatasetRecord]:
    """Every ``dcat:Dataset`` of the graph as a record, in id order (failed records last)."""
    nodes = set(graph.subjects(RDF.type, DCAT.Dataset))
    records = [record_from_node(graph, node, catalog_url, language) for node in nodes]
    return sorted(records, key=lambda r: (r.source_id is None, r.source_id or "", r.error or ""))


# -- paging ------------------------------------------------------------------------------------
def next_page(graph: Graph, page_url: str) -> str | None:
    """The Hydra next page of this page, resolved against its URL: ``next`` / ``nextPage`` of the
    paging node (the node named by the page's own URL first, then typed paging nodes, then any)."""
    views = {s for ns in HYDRA_NAMESPACES for cls in (ns.PagedCollection, ns.PartialCollectionView)
             for s in graph.subjects(RDF.type, cls)}
    links = [(s, str(o).strip()) for ns in HYDRA_NAMESPACES for p in (ns.next, ns.nextPage)
             for s, o in graph.subject_objects(p) if str(o).strip()]
    if not links:
        return None
    ranked = sorted(links, key=lambda sl: (str(sl[0]) != page_url, sl[0] not in views, sl[1]))
    chosen = ranked[0][1]
    others = {link for _, link in ranked[1:]} - {chosen}
    if others:
        log.warning("%s: several Hydra next pages (%s); following %s", scrub_url(page_url),
                    ", ".join(sorted(others)), chosen)
    return urljoin(page_url, chosen)


def total_items(graph: Graph) -> int | None:
    """``hydra:totalItems`` of the page (the largest, when several nodes say), None if absent."""
    totals = []
    for ns in HYDRA_NAMESPACES:
        for value in graph.objects(None, ns.totalItems):
            try:
                totals.append(int(str(value)))
            except ValueError:
                pass
    return max(totals) if totals else None


class RdfListing(Iterator[list[DatasetRecord]]):
    """The pages of one listing from ``url`` on; its counters say how it went: ``pages`` fetched,
    records ``listed``, ``loop_cut`` when a page came round again, ``complete`` once it ended by
    itself (not by a loop or the page limit), ``total`` from the first page's hydra:totalItems."""

    def __init__(self, url: str, fetch: Fetch, *, language: str | None = None, max_pages: int = 1000):
        self.url, self.fetch, self.language, self.max_pages = url, fetch, language, max_pages
        self.pages = 0
        self.listed = 0
        self.loop_cut = False
        self.complete = False
        self.total: int | None = None
        self._contexts: dict[str, Any] = {}
        self._pages = self._generate()

    def __next__(self) -> list[DatasetRecord]:
        return next(self._pages)

    def _generate(self) -> Iterator[list[DatasetRecord]]:
        seen_pages: set[str] = set()
        seen_ids: set[str] = set()
        page_url: str | None = self.url
        while page_url:
            if normalize_url(page_url) in seen_pages:
                log.warning("%s: page %s came round again; listing cut there", scrub_url(self.url), scrub_url(page_url))
                self.loop_cut = True
                return
            if self.pages >= self.max_pages:
                log.warning("%s: more than %d pages; listing stopped before %s", scrub_url(self.url), self.max_pages,
                            scrub_url(page_url))
                return
            seen_pages.add(normalize_url(page_url))
            body, content_type = self.fetch(page_url)
            self.pages += 1
            graph = parse_page(body, content_type, page_url, fetch=self.fetch, contexts=self._contexts)
            if self.pages == 1:
                self.total = total_items(graph)
            records = self._new_records(records_from_graph(graph, self.url, self.language), seen_ids)
            self.listed += len(records)
            if records:
                yield records
            page_url = next_page(graph, page_url)
        self.complete = True

    @staticmethod
    def _new_records(records: list[DatasetRecord], seen_ids: set[str]) -> list[DatasetRecord]:
        fresh = []
        for record in records:
            if record.source_id is not None:
                if record.source_id in seen_ids:
                    continue
                seen_ids.add(record.source_id)
            fresh.append(record)
        return fresh


def iter_pages(url: str, fetch: Fetch, *, language: str | None = None, max_pages: int = 1000) -> RdfListing:
    """The datasets of the catalogue at ``url``, a list per page; ``fetch(url) -> (body, content type)``.
    The returned iterator carries the listing's counters (``pages``, ``listed``, ``loop_cut``, ``complete``)."""
    return RdfListing(url, fetch, language=language, max_pages=max_pages)


class DcatRdfSource(CountsTraffic):
    """A DCAT-AP RDF catalogue over HTTP (``fetcher``: an ``http.HttpFetcher``). Lists the whole
    catalogue every run: no incremental or conditional requests, no reconciliation."""

    kind = DCAT_RDF
    capabilities = Capabilities()

    def __init__(self, url: str, *, fetcher, language: str | None = None, max_pages: int = 1000):
        self.url, self.fetcher, self.language, self.max_pages = url, fetcher, language, max_pages
        self._listing: RdfListing | None = None

    def __repr__(self) -> str:
        return f"DcatRdfSource({scrub_url(self.url)!r})"

    def fetch(self, url: str) -> tuple[bytes, str]:
        resp = self.fetcher.get(url, headers={"Accept": ACCEPT})
        if not 200 <= resp.status_code < 300:
            raise SourceError(f"{scrub_url(self.url)}: GET {scrub_url(url)}: HTTP {resp.status_code}")
        return resp.content, resp.headers.get("Content-Type", "")

    def iter_pages(self) -> Iterator[list[DatasetRecord]]:
        self._listing = iter_pages(self.url, self.fetch, language=self.language, max_pages=self.max_pages)
        return self._listing

    def iter_records(self, since=None, page_size: int | None = None, listing: Listing | None = None,
                     validators: dict | None = None) -> Iterator[list[DatasetRecord]]:
        """``base.Source``: the whole catalogue whatever ``since`` (the portal cannot filter)."""
        yield from self.iter_pages()
        if listing is not None:
            listing.complete = self.complete

    @property
    def pages(self) -> int:
        return self._listing.pages if self._listing else 0

    @property
    def listed(self) -> int:
        return self._listing.listed if self._listing else 0

    @property
    def loop_cut(self) -> bool:
        return bool(self._listing and self._listing.loop_cut)

    @property
    def complete(self) -> bool:
        return bool(self._listing and self._listing.complete)

    @property
    def total(self) -> int | None:
        return self._listing.total if self._listing else None

