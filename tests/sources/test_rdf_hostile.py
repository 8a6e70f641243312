"""Hostile RDF pages (issue 35): remote JSON-LD contexts at any depth come only through the source's
guarded fetch, rdflib itself opens nothing (its loaders are made to raise here, to prove they are
never reached), and RDF/XML, Turtle, N-Triples and JSON-LD parse in time linear in the page.

Documents come in as uploads through ``pipeline.validate`` (the API's path) with the real guarded
session (``FetchPolicy``); contexts are served by real HTTP servers on 127.0.0.1, one of which
stands for a metadata service the guard must keep the page away from."""
from __future__ import annotations

import json
import logging
import time
import urllib.request
import xml.sax.saxutils
import xml.sax.xmlreader

import pytest
import rdflib
import rdflib.graph
import rdflib.parser
import rdflib.plugins.shared.jsonld.util
from rdflib import Graph

from harvester.http.guard import AddressRefused, FetchPolicy
from harvester.pipeline import validate as v
from harvester.sources.dcat_rdf import RdfParseError, parse_page
from harvester.testing.hostile_http import Document, HostileServer

DCAT = "http://www.w3.org/ns/dcat#"
DCT = "http://purl.org/dc/terms/"
RDF_HEAD = (b'<rdf:RDF xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#" '
            b'xmlns:dcat="http://www.w3.org/ns/dcat#" xmlns:dct="http://purl.org/dc/terms/">')
TERMS = {"dcat": DCAT, "dct": DCT, "Dataset": "dcat:Dataset", "title": "dct:title"}


def serve(server: HostileServer, path: str, document, content_type: str = "application/ld+json") -> str:
    """``document`` (bytes, or JSON to dump) served at ``path``; its URL."""
    body = document if isinstance(document, bytes) else json.dumps(document).encode()
    return server.serve(path, Document(body, content_type))


@pytest.fixture
def contexts():
    """The context server, the one address the guard lets through."""
    with HostileServer() as server:
        yield server


@pytest.fixture
def metadata():
    """Stands for 127.0.0.1 metadata: the guard refuses it, so it must never be asked anything."""
    with HostileServer() as server:
        serve(server, "/latest/credentials", {"@context": {"secret": "http://leak.test/"}})
        yield server


@pytest.fixture(autouse=True)
def rdflib_opens_nothing(monkeypatch):
    """Every way rdflib (or the XML reader under it) could open a URL or a file raises here; what
    reached one is kept in ``opened``. Graph.parse still gets its ``data=`` string as usual."""
    opened: list = []

    def refuse(what):
        def raising(*args, **kwargs):
            opened.append((what, args))
            raise AssertionError(f"{what} reached: {args!r}")
        return raising

    real_create = rdflib.graph.create_input_source

    def data_only(source=None, publicID=None, location=None, file=None, data=None, format=None):  # noqa: N803
        if source is not None or location is not None or file is not None or data is None:
            refuse("rdflib create_input_source (not data=)")(source, location, file)
        return real_create(publicID=publicID, data=data, format=format)

    monkeypatch.setattr(rdflib.graph, "create_input_source", data_only)
    monkeypatch.setattr(rdflib.parser, "create_input_source", refuse("rdflib.parser.create_input_source"))
    monkeypatch.setattr(rdflib.plugins.shared.jsonld.util, "create_input_source", refuse("jsonld util loader"))
    monkeypatch.setattr(rdflib.parser.URLInputSource, "__init__", refuse("URLInputSource"))
    monkeypatch.setattr(rdflib.parser.FileInputSource, "__init__", refuse("FileInputSource"))
    monkeypatch.setattr(urllib.request, "urlopen", refuse("urllib.request.urlopen"))
    if hasattr(rdflib.parser, "urlopen"):
        monkeypatch.setattr(rdflib.parser, "urlopen", refuse("rdflib.parser.urlopen"))
    real_prepare = xml.sax.saxutils.prepare_input_source

    def streams_only(source, base=""):  # the page's own stream, never a system id to open
        if isinstance(source, xml.sax.xmlreader.InputSource) and (source.getByteStream() or
                                                                   source.getCharacterStream()):
            return real_prepare(source, base)
        refuse("xml.sax prepare_input_source (a URL or file)")(source, base)

    monkeypatch.setattr(xml.sax.saxutils, "prepare_input_source", streams_only)
    logging.getLogger("rdflib").setLevel(logging.CRITICAL)
    yield opened
    logging.getLogger("rdflib").setLevel(logging.NOTSET)
    assert opened == [], f"rdflib opened something itself: {opened}"


def strict(*servers: HostileServer) -> FetchPolicy:
    """The guard as the API runs it (no private addresses), letting through only ``servers``."""
    return FetchPolicy(allow_private=False, max_bytes=1024 * 1024, timeout=5, deadline=10, max_retries=0,
                       allowed=frozenset({("127.0.0.1", s.port) for s in servers}))


def page(context) -> bytes:
    return json.dumps({"@context": context, "@id": "http://data.test/d/1", "@type": "Dataset",
                       "title": "One dataset"}).encode()


def validate_jsonld(data: bytes, policy: FetchPolicy):
    return v.validate_bytes(data, "dcat-rdf", "x.jsonld", content_type="application/ld+json", fetcher=policy)


# -- finding 1: remote contexts at any depth come through the guarded fetch, or not at all --------------
@pytest.mark.parametrize("shape", ["string", "list", "import", "scoped", "scoped-in-page"])
def test_a_context_naming_a_refused_address_never_reaches_it(contexts, metadata, shape):
    inner = metadata.url("/latest/credentials")
    fetched = {
        "string": {"@context": inner},
        "list": {"@context": [{"dcat": DCAT}, inner]},
        "import": {"@context": {"@import": inner, "dct": DCT}},
        "scoped": {"@context": {**TERMS, "Dataset": {"@id": "dcat:Dataset", "@context": inner}}},
        "scoped-in-page": {"@context": TERMS},
    }[shape]
    first = serve(contexts, "/first.jsonld", fetched)
    context = ([first, {"title": {"@id": "dct:title", "@context": [inner]}}] if shape == "scoped-in-page"
               else [first, TERMS] if shape != "scoped" else first)
    with pytest.raises(AddressRefused, match="loopback"):
        validate_jsonld(page(context), strict(contexts))
    assert contexts.hits == ["/first.jsonld"]
    assert metadata.hits == []


NOT_HTTP = ["file:///etc/passwd", "file:///dev/zero", "ftp://ftp.test/context.jsonld", "data:application/ld+json,{}"]


@pytest.mark.parametrize("where, ref", [(where, ref) for where in ("page", "nested", "import") for ref in NOT_HTTP]
                         + [("page", "context.jsonld")])  # relative to an upload: no http(s) URL either
def test_a_context_that_is_not_http_is_refused_by_name_never_opened(contexts, metadata, where, ref):
    nested = serve(contexts, "/nested.jsonld", {"@context": [TERMS, ref] if where == "nested" else
                                               {"@import": ref, "dcat": DCAT}})
    context = [TERMS, ref] if where == "page" else [nested, TERMS]
    with pytest.raises(RdfParseError) as caught:
        validate_jsonld(page(context), strict(contexts))
    assert repr(ref) in str(caught.value) and "not an http(s) URL: refused, never opened" in str(caught.value)
    assert "x.jsonld" in str(caught.value) and caught.value.transient is False
    assert metadata.hits == [] and contexts.hits == ([] if where == "page" else ["/nested.jsonld"])


def test_nested_contexts_are_inlined_through_the_fetch(contexts):
    """A context naming another (relative to itself), a list, an @import and a scoped context: all
    fetched once through the guarded session, and the page reads as if they were written in it."""
    serve(contexts, "/ctx/terms.jsonld", {"@context": {"dcat": DCAT, "dct": DCT, "@base": "http://evil.test/"}})
    serve(contexts, "/ctx/title.jsonld", {"@context": {"title": {"@id": "dct:title"}}})
    serve(contexts, "/ctx/scoped.jsonld", {"@context": {"label": "dct:title"}})
    top = serve(contexts, "/ctx/top.jsonld", {"@context": [
        "terms.jsonld", {"@import": "title.jsonld"},
        {"Dataset": {"@id": "dcat:Dataset", "@context": "scoped.jsonld"}}]})
    data = json.dumps({"@context": [top, {"@base": "http://data.test/"}], "@graph": [
        {"@id": "d/1", "@type": "Dataset", "label": "One"},
        {"@id": "d/2", "@type": "Dataset", "title": "Two", "@context": top}]}).encode()
    report = validate_jsonld(data, strict(contexts))
    assert report.records == 2 and report.failed == 0
    graph = parse_page(data, "application/ld+json", "http://data.test/page.jsonld",
                       fetch=lambda url: (contexts.routes[url.removeprefix(contexts.base_url)].body, ""))
    titles = {str(s): str(o) for s, o in graph.subject_objects(rdflib.URIRef(DCT + "title"))}
    assert titles == {"http://data.test/d/1": "One", "http://data.test/d/2": "Two"}
    assert sorted(set(contexts.hits)) == ["/ctx/scoped.jsonld", "/ctx/terms.jsonld", "/ctx/title.jsonld",
                                          "/ctx/top.jsonld"]
    assert len(contexts.hits) == 4  # each once, though named twice


def test_a_context_including_itself_is_refused(contexts):
    a, b = contexts.url("/a.jsonld"), contexts.url("/b.jsonld")
    serve(contexts, "/a.jsonld", {"@context": [TERMS, b]})
    serve(contexts, "/b.jsonld", {"@context": {"@import": a}})
    with pytest.raises(RdfParseError, match=r"/a\.jsonld' includes itself"):
        validate_jsonld(page(a), strict(contexts))


def test_remote_contexts_are_bounded_in_depth_and_count(contexts):
    for n in range(8):
        serve(contexts, f"/chain/{n}.jsonld", {"@context": [{"dcat": DCAT}, f"{n + 1}.jsonld"]})
    with pytest.raises(RdfParseError, match="nested more than 5 deep"):
        validate_jsonld(page([contexts.url("/chain/0.jsonld"), TERMS]), strict(contexts))
    many = [serve(contexts, f"/many/{n}.jsonld", {"@context": {f"t{n}": DCAT}}) for n in range(12)]
    with pytest.raises(RdfParseError, match="more than 10 remote contexts in one page"):
        validate_jsonld(page([*many, TERMS]), strict(contexts))
    assert len([h for h in contexts.hits if h.startswith("/many/")]) == 10


def test_a_small_context_named_many_times_cannot_blow_up(contexts):
    """A context of ~40 kB named in a list of itself a thousand times: refused once the inlined
    copies would pass 32 MB, not expanded."""
    big = serve(contexts, "/big.jsonld", {"@context": {f"term{n}": f"{DCAT}t{n}" for n in range(1500)}})
    fan = serve(contexts, "/fan.jsonld", {"@context": [big] * 1000})
    started = time.monotonic()
    with pytest.raises(RdfParseError, match="more than 32 MB"):
        validate_jsonld(page([fan, fan, TERMS]), strict(contexts))
    assert time.monotonic() - started < 20


def test_rdflib_own_context_loader_refuses_with_a_clear_error(metadata):
    """Defence in depth: handed a remote context directly, rdflib's loader is Harvester's refusal."""
    data = json.dumps({"@context": metadata.url("/latest/credentials"), "@id": "http://a", "secret": "x"})
    with pytest.raises(RdfParseError, match="rdflib tried to open .*/latest/credentials' itself: remote contexts "
                                            "are fetched only through Harvester's guarded client"):
        Graph().parse(data=data, format="json-ld")
    with pytest.raises(RdfParseError, match="rdflib tried to open 'file:///etc/passwd' itself"):
        Graph().parse(data=json.dumps({"@context": {"@import": "file:///etc/passwd"}, "@id": "http://a"}),
                      format="json-ld")
    assert metadata.hits == []


# -- finding 2: RDF/XML opens nothing outside the document -----------------------------------------
def rdfxml(doctype: bytes, title: bytes = b"One") -> bytes:
    return (b'<?xml version="1.0"?>\n' + doctype + b"\n" + RDF_HEAD + b'<dcat:Dataset rdf:about="http://data.test/d/1">'
            b"<dct:title>" + title + b"</dct:title></dcat:Dataset></rdf:RDF>")


def validate_rdfxml(data: bytes, policy: FetchPolicy | None = None):
    return v.validate_bytes(data, "dcat-rdf", "x.rdf", content_type="application/rdf+xml",
                            fetcher=policy or FetchPolicy(allow_private=False, timeout=5, deadline=10))


@pytest.mark.parametrize("system", ["file:///etc/passwd", "file:///dev/zero", "METADATA"])
def test_an_external_entity_is_refused_by_name_never_opened(metadata, system):
    system = system.replace("METADATA", metadata.url("/latest/credentials")).encode()
    for doctype, title in ((b'<!DOCTYPE rdf:RDF [<!ENTITY x SYSTEM "' + system + b'">]>', b"&x;"),
                           (b'<!DOCTYPE rdf:RDF [<!ENTITY % p SYSTEM "' + system + b'"> %p;]>', b"One")):
        with pytest.raises(RdfParseError) as caught:
            validate_rdfxml(rdfxml(doctype, title))
        assert "x.rdf" in str(caught.value) and "refused" in str(caught.value)
        if b"ENTITY x" in doctype:
            assert repr(system.decode()) in str(caught.value)
    assert metadata.hits == []


def test_an_external_dtd_is_not_read(metadata):
    dtd = metadata.url("/latest/credentials").encode()
    report = validate_rdfxml(rdfxml(b'<!DOCTYPE rdf:RDF SYSTEM "' + dtd + b'">'))
    assert report.records == 1 and report.failed == 0
    assert metadata.hits == []


def test_plain_namespace_entities_still_read():
    doctype = b'<!DOCTYPE rdf:RDF [<!ENTITY dct "http://purl.org/dc/terms/"> <!ENTITY t "One caf&#233;">]>'
    graph = parse_page(rdfxml(doctype, b"&t;").replace(b'xmlns:dct="http://purl.org/dc/terms/"',
                                                         b'xmlns:dct="&dct;"'), "application/rdf+xml",
                       "http://portal.test/c.rdf")
    assert [str(o) for o in graph.objects(None, rdflib.URIRef(DCT + "title"))] == ["One café"]


# -- finding 3: parsing time linear in the page -----------------------------------------------------
def timed(call):
    started = time.monotonic()
    result = call()
    return result, time.monotonic() - started


def test_a_two_megabyte_literal_of_a_million_lines_parses_in_seconds():
    data = rdfxml(b"", b"x\n" * 1_000_000)
    assert len(data) > 2_000_000
    graph, seconds = timed(lambda: parse_page(data, "application/rdf+xml", "http://portal.test/c.rdf"))
    [title] = graph.objects(None, rdflib.URIRef(DCT + "title"))
    assert str(title) == "x\n" * 1_000_000
    assert seconds < 20  # rdflib's own handler: 136 s


def test_an_xml_literal_of_many_elements_parses_in_seconds():
    markup = b"<b>x</b>\n" * 100_000
    data = (RDF_HEAD + b'<dcat:Dataset rdf:about="http://data.test/d/1"><dct:title>t</dct:title>'
            b'<dct:description rdf:parseType="Literal">' + markup + b"</dct:description></dcat:Dataset></rdf:RDF>")
    graph, seconds = timed(lambda: parse_page(data, "application/rdf+xml", "http://portal.test/c.rdf"))
    [description] = graph.objects(None, rdflib.URIRef(DCT + "description"))
    assert str(description) == markup.decode()
    assert description.datatype == rdflib.RDF.XMLLiteral
    assert seconds < 20  # rdflib's own handler: over 300 s (each piece re-parsed the XML so far)


def test_nested_entities_are_refused_at_once():
    """900 bytes that expand to 7 million characters (under expat's amplification guard's 8 MiB
    threshold): refused at the declaration, by name."""
    entities = b'<!ENTITY e0 "xxxxxxxxxx">' + b"".join(
        b'<!ENTITY e%d "%s">' % (i, (b"&e%d;" % (i - 1)) * 10) for i in range(1, 6))
    data = rdfxml(b"<!DOCTYPE rdf:RDF [" + entities + b"]>", b"&e5;" * 70)
    assert len(data) < 1200
    with pytest.raises(RdfParseError, match=r"declares the entity e1 with a reference or markup") as caught:
        timed(lambda: parse_page(data, "application/rdf+xml", "http://portal.test/c.rdf"))
    assert "http://portal.test/c.rdf" in str(caught.value) and caught.value.transient is False


def test_a_flat_entity_repeated_is_bounded_by_the_text_cap():
    value = b"x" * 1000
    data = rdfxml(b'<!DOCTYPE rdf:RDF [<!ENTITY e "' + value + b'">]>', b"&e;" * 200_000)
    started = time.monotonic()
    with pytest.raises(RdfParseError, match="expands to more than .* characters of text"):
        parse_page(data, "application/rdf+xml", "http://portal.test/c.rdf")
    assert time.monotonic() - started < 20


def test_long_turtle_and_ntriples_literals_parse_in_seconds():
    turtle = b'@prefix dcat: <http://www.w3.org/ns/dcat#> . <http://a> a dcat:Dataset ; dcat:keyword """' + (
        b"x\n" * 1_000_000) + b'""" .'
    graph, seconds = timed(lambda: parse_page(turtle, "text/turtle", "http://portal.test/c.ttl"))
    assert len(str(next(graph.objects(None, rdflib.URIRef(DCAT + "keyword"))))) == 2_000_000
    assert seconds < 20  # rdflib's own: 46 s
    ntriples = (b'<http://a> <http://www.w3.org/1999/02/22-rdf-syntax-ns#type> <http://www.w3.org/ns/dcat#Dataset> .\n'
                b'<http://a> <http://www.w3.org/ns/dcat#keyword> "' + b"x\\n" * 1_500_000 + b'" .\n')
    graph, seconds = timed(lambda: parse_page(ntriples, "application/n-triples", "http://portal.test/c.nt"))
    assert str(next(graph.objects(None, rdflib.URIRef(DCAT + "keyword")))) == "x\n" * 1_500_000
    assert seconds < 20  # rdflib's own: over 60 s (each 2 kB read matched the line from its start)


@pytest.mark.parametrize("fmt, data, message", [
    ("application/ld+json", b"[" * 100_000 + b"]" * 100_000, "nests JSON deeper than Python can read"),
    ("application/ld+json", b'{"@id": "http://a", "http://b": ' * 150 + b"1" + b"}" * 150,
     "nests JSON more than 100 levels deep"),
    ("text/turtle", b"@prefix : <http://a/> . :a :p " + b"[ :p " * 100_000 + b":b" + b" ]" * 100_000 + b" .",
     "turtle: nested too deeply to read"),
    ("text/turtle", b"@prefix : <http://a/> . :a :p " + b"( " * 100_000 + b")" * 100_000 + b" .",
     "turtle: nested too deeply to read"),
])
def test_deep_nesting_is_a_clear_parse_error(fmt, data, message):
    with pytest.raises(RdfParseError) as caught:
        parse_page(data, fmt, "http://portal.test/deep")
    assert message in str(caught.value) and "http://portal.test/deep" in str(caught.value)
