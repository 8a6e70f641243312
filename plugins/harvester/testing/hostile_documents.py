"""Catalogues written to hurt whoever parses them (test-only), as issue 35 found them: each small to
send and costly to read. The servers that answer hostilely (a drip, an endless answer, one that
never answers) are harvester.testing.hostile_http's.

- ``quadratic_rdfxml``: RDF/XML whose one literal spans a million lines (2 MB): a parser that
  appends each line's text to what it has is quadratic (rdflib: 136 s);
- ``nested_entities_rdfxml``: under a kilobyte of nested XML entities expanding to a megabyte of
  tiny pieces of text (140 s), below expat's amplification guard;
- ``broken_data_json``: a data.json of ``size`` bytes of entries that are all broken (``{}``: no
  identifier, no title; two rows each: 1.7 M rows in 5 MB);
- ``jsonld_with_context``: a JSON-LD catalogue whose context names ``ref`` at the top, in a
  nested node, through ``@import`` or as a term's scoped context.
"""
from __future__ import annotations

import json

DCAT = "http://www.w3.org/ns/dcat#"
DCT = "http://purl.org/dc/terms/"
_RDF_HEAD = ('<?xml version="1.0" encoding="utf-8"?>\n{doctype}'
             '<rdf:RDF xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#" '
             f'xmlns:dcat="{DCAT}" xmlns:dct="{DCT}">\n'
             '<dcat:Catalog rdf:about="http://example.org/catalog">\n'
             '<dct:title>Catalogue</dct:title>\n'
             '<dcat:dataset><dcat:Dataset rdf:about="http://example.org/d1">\n'
             '<dct:identifier>d1</dct:identifier>\n<dct:title>{title}</dct:title>\n'
             '</dcat:Dataset></dcat:dataset>\n</dcat:Catalog>\n</rdf:RDF>\n')


def quadratic_rdfxml(lines: int = 1_000_000) -> bytes:
    """A catalogue of one dataset whose title is ``lines`` lines of one character (2 bytes a line)."""
    return _RDF_HEAD.replace("{doctype}", "").replace("{title}", "x\n" * lines).encode()


def nested_entities_rdfxml(levels: int = 6, fan: int = 10) -> bytes:
    """A catalogue whose title is an entity expanding to ``fan ** levels`` copies of one character
    through ``levels`` nested entities (6, 10: a million pieces, from under a kilobyte)."""
    entities = ['<!ENTITY e0 "x">'] + [f'<!ENTITY e{n} "{("&e%d;" % (n - 1)) * fan}">' for n in range(1, levels + 1)]
    doctype = "<!DOCTYPE rdf:RDF [\n" + "\n".join(entities) + "\n]>\n"
    return _RDF_HEAD.replace("{doctype}", doctype).replace("{title}", f"&e{levels};").encode()


def broken_data_json(size: int = 5 * 1024 * 1024, entry: bytes = b"{}") -> bytes:
    """A data.json of about ``size`` bytes, every entry ``entry`` (``{}``: no identifier, no title)."""
    count = max(1, (size - 16) // (len(entry) + 1))
    return b'{"dataset": [' + b",".join([entry] * count) + b"]}"


def jsonld_with_context(ref: str, where: str = "top") -> bytes:
    """A JSON-LD catalogue of one dataset whose context names the remote context ``ref``: ``top``
    (the document's @context), ``nested`` (the dataset node's own @context), ``import`` (an
    @import in the document's context) or ``scoped`` (a term's scoped context)."""
    terms = {"dcat": DCAT, "dct": DCT}
    dataset: dict = {"@id": "http://example.org/d1", "@type": "dcat:Dataset", "dct:identifier": "d1",
                     "dct:title": "A dataset"}
    context: object = terms
    if where == "top":
        context = [ref, terms]
    elif where == "nested":
        dataset["@context"] = ref
    elif where == "import":
        context = {"@version": 1.1, "@import": ref, **terms}
    elif where == "scoped":
        context = {**terms, "dcat:dataset": {"@id": DCAT + "dataset", "@context": ref}}
    else:
        raise ValueError(f"where={where!r}: one of top, nested, import, scoped")
    document = {"@context": context, "@graph": [{"@id": "http://example.org/catalog", "@type": "dcat:Catalog",
                                                 "dct:title": "Catalogue", "dcat:dataset": dataset}]}
    return json.dumps(document).encode()
