"""Test-only: a DCAT-AP aggregator's catalogue that republishes CKAN records as data.europa.eu
republishes national portals' datasets: under its own IRIs, with ``dct:identifier`` the source's
identifier, ``dcat:landingPage`` the source portal's page of the dataset, the same distributions
and publisher, and ``adms:identifier`` / ``dct:source`` left out (not every aggregator writes them).
"""
from __future__ import annotations

from typing import Iterable

from rdflib import BNode, Graph, Literal, Namespace, URIRef
from rdflib.namespace import DCAT, DCTERMS, FOAF, RDF

from harvester.domain.dataset import clean_text, landing_page


def dataset_iri(n: int, record: dict, base: str = "https://aggregator.example") -> str:
    """The aggregator's IRI of the ``n``-th record it republishes."""
    return f"{base.rstrip('/')}/set/data/{n:05d}-{(record.get('name') or record['id'])[:40]}"


def catalogue(records: Iterable[dict], source_portal_url: str, *, base: str = "https://aggregator.example",
              identifier: str = "id", point_back: bool = True, language: str = "en") -> bytes:
    """Turtle of a dcat:Catalog holding one dcat:Dataset per CKAN record. ``identifier``: which of
    the record's values the aggregator writes as dct:identifier ("id": its id; "page": the source's
    landing page; None: none). ``point_back``: dcat:landingPage is the source portal's page (else
    the aggregator's own)."""
    g = Graph()
    g.bind("dcat", DCAT)
    g.bind("dct", DCTERMS)
    agg = Namespace(base.rstrip("/") + "/")
    cat = URIRef(agg["catalogue"])
    g.add((cat, RDF.type, DCAT.Catalog))
    g.add((cat, DCTERMS.title, Literal("Aggregator", lang=language)))
    for n, rec in enumerate(records):
        ds = URIRef(dataset_iri(n, rec, base))
        g.add((cat, DCAT.dataset, ds))
        g.add((ds, RDF.type, DCAT.Dataset))
        g.add((ds, DCTERMS.title, Literal(clean_text(rec.get("title")) or rec.get("name") or rec["id"], lang=language)))
        notes = clean_text(rec.get("notes"))
        if notes:
            g.add((ds, DCTERMS.description, Literal(notes, lang=language)))
        page = landing_page(source_portal_url, rec.get("name") or rec["id"])
        if identifier == "id":
            g.add((ds, DCTERMS.identifier, Literal(rec["id"])))
        elif identifier == "page":
            g.add((ds, DCTERMS.identifier, Literal(page)))
        g.add((ds, DCAT.landingPage, URIRef(page if point_back else str(ds) + "/page")))
        if rec.get("metadata_modified"):
            g.add((ds, DCTERMS.modified, Literal(str(rec["metadata_modified"])[:19])))
        org = rec.get("organization") if isinstance(rec.get("organization"), dict) else None
        if org and (org.get("title") or org.get("name")):
            publisher = BNode()
            g.add((ds, DCTERMS.publisher, publisher))
            g.add((publisher, RDF.type, FOAF.Agent))
            g.add((publisher, FOAF.name, Literal(org.get("title") or org.get("name"))))
        for tag in rec.get("tags") or []:
            name = tag.get("name") if isinstance(tag, dict) else tag
            if name:
                g.add((ds, DCAT.keyword, Literal(name, lang=language)))
        for r in rec.get("resources") or []:
            url = (r.get("url") or "").strip()
            if not url.startswith(("http://", "https://")):
                continue
            dist = BNode()
            g.add((ds, DCAT.distribution, dist))
            g.add((dist, RDF.type, DCAT.Distribution))
            g.add((dist, DCAT.accessURL, URIRef(url)))
            if r.get("format"):
                g.add((dist, DCTERMS.format, Literal(r["format"])))
    return g.serialize(format="turtle").encode("utf-8")
