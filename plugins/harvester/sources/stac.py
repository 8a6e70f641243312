"""STAC catalogues as a source, one dataset per STAC Collection: ``type: stac``.

The portal's url is one of (told from the document it answers, as pystac-client's ``Client.open``
and ``get_collections`` tell them):

- a **STAC API** landing page (``type: Catalog`` with ``conformsTo``): its ``rel: data`` link (else
  ``<url>/collections`` when it conforms to the Collections class) is the collection listing;
- the listing itself (a url whose path ends in ``/collections``, or any answer holding a
  ``collections`` list);
- a **static catalog** (``catalog.json``, or a landing page that neither links ``data`` nor conforms
  to Collections): its ``child`` links are walked, relative hrefs resolved against the document's
  own URL; every Collection met is a dataset, every Catalog (or Collection) is walked further;
  ``item`` links are not followed (items are not datasets). A Collection document itself is one
  dataset (and its children are walked).

API paging (radiantearth/stac-api-spec, "Collection Pagination"): ``GET <collections>?limit=N``
(``N`` the portal's page_size; servers cap it: earth-search answers at most 100), then the page's
``rel: next`` link as given (its parameter is the server's own: FedEO's ``startRecord``, a
``token``...), resolved against the page's URL. A next link whose ``method`` is not GET (a POST with
a ``body``) ends the run with a SourceError saying so: every request goes through the GET-only
fetcher, and a listing that cannot be continued must not pass for a complete one. The total is
``numberMatched`` (OGC API), else ``context.matched`` (the older Context extension), else none.

A listing is complete when the API ends it itself: a page without a next link, or an empty page,
once the total (when given) is reached by distinct collection ids. It is cut, with a warning and
``complete`` False (nothing is removed on it), when a next link was followed before, a page holds
exactly the collections of an earlier page, a next link leaves the host of the listing (another
server's collections are not this portal's), or after ``max_pages`` pages.
A static walk is complete when every child document was read: a child on another host is not
followed (not this portal's; the walk stays complete), a child link back to a document already
read (a loop) is read once only (warning; still complete: nothing was missed), while a child that
answers 404 or an error, a walk deeper than ``max_depth`` or longer than ``max_documents``
documents leaves it incomplete (warning).

There is no "modified since" in STAC: the Collection Search extension's ``datetime`` filters the
collections' temporal extent, not their metadata. So every run reads every collection (collections
are few: 9 at earth-search, 126 at Planetary Computer, 2,365 at FedEO), and the pipeline's hashes
find what changed; ``updated`` (else ``created``) is the dataset's ``metadata_modified``.

Mapping (a CKAN-shaped package): ``id`` (required: ``no-identifier``) as source id and name,
``title`` (optional in STAC: the id stands for it, warned ``title-from-identifier``),
``description``, ``keywords`` as tags, ``license`` (an SPDX id, or ``various``/``other``/
``proprietary`` with its ``rel: license`` link as ``license_url``), the organization from
``providers`` by role (producer, else licensor, else host, else processor, else the first),
``created``/``updated``, ``assets`` and the links ``items``, ``license``, ``about``,
``describedby``, ``alternate``, ``cite-as`` and ``preview`` as resources, the ``self`` link as the
landing page (else ``<collections>/<id>`` in an API, the document's URL in a static catalog), the
Language extension's ``language.code`` (its primary subtag: ``pt`` of ``pt-BR``) as the record's
language (else the portal's ``language``), and every other field (``extent``, ``summaries``,
``providers``, ``item_assets``, ``links``, ``stac_version``...) as an extra, which the metadata hash
sees.
"""
from __future__ import annotations

import logging
from collections import deque
from typing import Any, Iterator, Mapping
from urllib.parse import parse_qs, urlencode, urljoin, urlsplit, urlunsplit

from harvester.config.portals import STAC
from harvester.domain.dataset import (DatasetRecord, clean_text, failed, normalize_url, package_record,
                                      parse_timestamp, screened_as_published, sha256_hex, text_list)
from harvester.domain.outcomes import problem
from harvester.http import Retryable, scrub_url
from harvester.sources.base import BadRecord, Capabilities, CountsTraffic, Listing, SourceError, coded
from harvester.sources.json_stream import loads

log = logging.getLogger(__name__)

KIND = STAC
MAX_LICENSE_CHARS = 500
# Conformance classes that promise GET /collections (pystac-client's ConformanceClasses.COLLECTIONS
# and the OGC API Features core, which STAC APIs list for it).
_COLLECTIONS_CLASSES = ("api.stacspec.org/v1.0.0/collections", "api.stacspec.org/v1.0.0-rc",
                        "api.stacspec.org/v1.0.0-beta", "ogcapi-features", "opengis.net/spec/ogcapi-features-1")
_RESOURCE_RELS = ("items", "license", "about", "describedby", "alternate", "cite-as", "preview")
_ROLE_ORDER = ("producer", "licensor", "host", "processor")
_MAPPED = frozenset({"id", "title", "description", "keywords", "license", "created", "updated", "language"})


class ChildFailed(SourceError):
    """A child document of a static catalog answered 404 or an error: that branch is unread."""


# -- mapping --------------------------------------------------------------------------------------
def collection_id(doc: Any) -> str | None:
    if not isinstance(doc, dict):
        return None
    value = doc.get("id")
    if isinstance(value, (str, int)) and not isinstance(value, bool) and str(value).strip():
        return str(value).strip()
    return None


def is_collection(doc: Mapping) -> bool:
    """A STAC Collection: ``type: Collection``, or (before STAC 1.0, as the CBERS catalogue) a
    document with an ``extent`` and a ``license``."""
    kind = doc.get("type")
    if kind == "Collection":
        return True
    return kind is None and isinstance(doc.get("extent"), dict) and "license" in doc


def links_of(doc: Mapping, rel: str) -> list[Mapping]:
    links = doc.get("links")
    if not isinstance(links, list):
        return []
    return [link for link in links if isinstance(link, dict) and link.get("rel") == rel
            and isinstance(link.get("href"), str) and link["href"].strip()]


def _resolve(base: str, href: str) -> str | None:
    """``href`` resolved against ``base``; None unless it is an http(s) URL then."""
    href = href.strip()
    if href.startswith(("https://", "http://")) and not any(c in href for c in " \t\r\n"):
        return href  # (absolute already: most links; urljoin is the mapping's largest cost)
    try:
        url = urljoin(base, href.strip())
        scheme = urlsplit(url).scheme.lower()
    except ValueError:
        return None
    return url if scheme in ("http", "https") else None



def _provider(providers: Any) -> str | None:
    """The organization a collection is published by, from its providers by role."""
    if not isinstance(providers, list):
        return None
    named = [p for p in providers if isinstance(p, dict) and isinstance(p.get("name"), str)
             and clean_text(p["name"])]
    for role in _ROLE_ORDER:
        for p in named:
            if isinstance(p.get("roles"), list) and role in p["roles"]:
                return clean_text(p["name"])
    return clean_text(named[0]["name"]) if named else None


def _date(doc: Mapping, key: str, ident: str, warnings: list) -> str | None:
    value = doc.get(key)
    if value is None:
        return None
    if parse_timestamp(value) is None:
        warnings.append(problem("bad-optional-date", f"collection {ident!r}: its {key} {value!r} is not a date: "
                                "stored without it", key, value))
        return None
    return value


def to_package(doc: Mapping, base: str, fallback_url: str) -> tuple[dict, list]:
    """A STAC Collection as a CKAN-shaped package and its warnings. ``base``: the URL its relative
    hrefs resolve against; ``fallback_url``: its landing page when it has no ``self`` link. Raises
    BadRecord when it has no id, or a title or description that is not text."""
    ident = collection_id(doc)
    if ident is None:
        raise BadRecord("no-identifier", f"collection with title {str(doc.get('title'))[:80]!r}: no id", "id",
                        doc.get("id"))
    warnings: list = []
    title = doc.get("title")
    if title is not None and not isinstance(title, str):
        raise BadRecord("wrong-type", f"collection {ident!r}: its title is {type(title).__name__}, not text",
                        "title", title)
    if not clean_text(title):
        warnings.append(problem("title-from-identifier", f"collection {ident!r} has no title: stored under its id",
                                "title", title))
        title = ident
    description = doc.get("description")
    if description is not None and not isinstance(description, str):
        raise BadRecord("wrong-type", f"collection {ident!r}: its description is {type(description).__name__}, "
                        "not text", "description", description)
    self_links = [u for u in (_resolve(base, link["href"]) for link in links_of(doc, "self")) if u]
    url = self_links[0] if self_links else fallback_url
    base = url
    licence = doc.get("license")
    licence = clean_text(licence)[:MAX_LICENSE_CHARS] if isinstance(licence, str) and clean_text(licence) else None
    licence_links = [u for u in (_resolve(base, link["href"]) for link in links_of(doc, "license")) if u]
    resources = []
    assets = doc.get("assets")
    for name, asset in (assets.items() if isinstance(assets, dict) else ()):
        if isinstance(asset, dict) and isinstance(asset.get("href"), str):
            href = _resolve(base, asset["href"])
            if href:
                resources.append({"url": href, "name": clean_text(asset.get("title")) or str(name),
                                  "format": asset.get("type") if isinstance(asset.get("type"), str) else "",
                                  "description": clean_text(asset.get("description")) or None,
                                  "roles": text_list(asset.get("roles"))})
    for rel in _RESOURCE_RELS:
        for link in links_of(doc, rel):
            href = _resolve(base, link["href"])
            if href:
                resources.append({"url": href, "name": clean_text(link.get("title")) or rel,
                                  "format": link.get("type") if isinstance(link.get("type"), str) else "",
                                  "rel": rel})
    org = _provider(doc.get("providers"))
    created = _date(doc, "created", ident, warnings)
    updated = _date(doc, "updated", ident, warnings)
    language = doc.get("language")
    code = language.get("code") if isinstance(language, dict) else None
    pkg = {
        "id": ident,
        "name": ident,
        "title": title,
        "notes": description,
        "tags": [{"name": t} for t in text_list(doc.get("keywords"))],
        "organization": {"title": org, "name": org} if org else None,
        "license_id": licence,
        "license_url": licence_links[0] if licence_links else None,
        "metadata_created": created,
        "metadata_modified": updated or created,
        "resources": resources,
        "url": url,
        "type": doc.get("type") if isinstance(doc.get("type"), str) else "Collection",
        "extras": {k: v for k, v in doc.items() if k not in _MAPPED},
    }
    if isinstance(code, str) and code.strip():  # a BCP 47 tag: its language (pt-BR: pt) picks the text search
        pkg["language"] = code.strip().split("-")[0].lower()
    return pkg, warnings


@screened_as_published(collection_id)
def normalize(doc: Any, base: str, fallback_url: str, language: str | None = None) -> DatasetRecord:
    """A STAC Collection as a DatasetRecord; an unusable one comes back failed, saying why."""
    ident = collection_id(doc)
    try:
        if not isinstance(doc, dict):
            raise BadRecord("not-an-object", f"collection is {type(doc).__name__}, not a JSON object")
        pkg, warnings = to_package(doc, base, fallback_url)
    except ValueError as exc:
        return failed(ident, doc, coded(exc))
    title, description = clean_text(pkg["title"]), clean_text(pkg["notes"])
    org = pkg["organization"]
    return package_record(pkg, source_id=pkg["id"], name=pkg["name"], url=pkg["url"],
                          url_hash=sha256_hex(normalize_url(pkg["url"])), title=title, description=description,
                          tags=sorted({t["name"] for t in pkg["tags"]}), organization=org["title"] if org else None,
                          notes_text=description, warnings=tuple(warnings),
                          language=pkg.get("language") or language)


# -- over HTTP ------------------------------------------------------------------------------------
def _with_params(url: str, params: Mapping[str, Any]) -> str:
    parts = urlsplit(url)
    query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
    query.update({k: str(v) for k, v in params.items()})
    return urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(query), ""))


def _host(url: str) -> str:
    return (urlsplit(url).hostname or "").lower()


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def page_total(page: Mapping) -> int | None:
    """A page's total: ``numberMatched``, else the Context extension's ``context.matched``."""
    total = _count(page.get("numberMatched"))
    if total is None and isinstance(page.get("context"), dict):
        total = _count(page["context"].get("matched"))
    return total


def conforms_to_collections(doc: Mapping) -> bool:
    classes = doc.get("conformsTo")
    return isinstance(classes, list) and any(
        isinstance(c, str) and any(mark in c for mark in _COLLECTIONS_CLASSES) for c in classes)


class StacSource(CountsTraffic):
    """A STAC API's collections, or a static STAC catalog's, GETs through ``fetcher``
    (harvester.http.HttpFetcher). After a listing: ``mode`` ("api" or "static"), ``total`` (the
    API's, when it gives one), ``listed`` (distinct collections), ``cut`` (why the listing was
    cut, or None), ``complete``."""

    kind = KIND
    # no modified-since filter in STAC: every run reads every collection; the hashes find changes
    capabilities = Capabilities()
    max_pages = 10_000  # pages of an API's /collections
    max_documents = 50_000  # documents of a static catalog walk
    max_depth = 32  # child links from the root of a static catalog

    def __init__(self, url: str, *, fetcher, portal=None):
        self.url = url.strip()
        self.portal = getattr(portal, "name", None) or (portal if isinstance(portal, str) else scrub_url(self.url))
        self.language = getattr(portal, "language_code", None)
        self.fetcher = fetcher
        self.mode: str | None = None
        self.total: int | None = None
        self.listed = 0
        self.cut: str | None = None
        self.complete = False

    def __repr__(self) -> str:
        return f"StacSource({scrub_url(self.url)!r})"

    # -- one document ------------------------------------------------------------------------------
    def _get(self, url: str, *, child: bool = False) -> dict:
        where = f"{self.portal}: GET {scrub_url(url)}"

        def parse(resp):
            if not 200 <= resp.status_code < 300:
                reason = f"HTTP {resp.status_code} {resp.reason or ''}".rstrip()
                if child:
                    raise ChildFailed(f"{where}: {reason}")
                if resp.status_code == 404:
                    raise SourceError(f"{where}: HTTP 404 Not Found: no STAC catalog or API at this URL")
                raise SourceError(f"{where}: {reason}")
            try:
                doc = loads(resp.content)
            except ValueError as exc:  # a cut body or a proxy's page: try again
                raise Retryable(f"the answer is not JSON ({exc})") from exc
            if not isinstance(doc, dict):
                raise (ChildFailed if child else SourceError)(
                    f"{where}: the answer is a JSON {type(doc).__name__}, not a STAC document")
            return doc

        return self.fetcher.get(url, parse=parse, what=where, headers={"Accept": "application/json"})

    # -- the listing -------------------------------------------------------------------------------
    def iter_records(self, since, page_size: int, listing: Listing,
                     validators: dict | None = None) -> Iterator[list[DatasetRecord]]:
        """The Source protocol (sources/base.py): every collection (``since`` is not a filter STAC
        has), ``page_size`` records a page; ``listing.complete`` when the API or the walk ended
        by itself."""
        self.mode, self.total, self.listed, self.cut, self.complete = None, None, 0, None, False
        seen: set[str] = set()
        page: list[DatasetRecord] = []
        size = max(1, page_size)
        for doc, base, fallback in self._collections(page_size):
            ident = collection_id(doc)
            if ident is not None and ident in seen:
                record = failed(ident, {"id": ident}, [problem(
                    "duplicate-identifier", f"collection {ident!r} is listed twice (first seen earlier in the "
                    "listing): the later one is left out", "id", ident)])
            else:
                record = normalize(doc, base, fallback, self.language)
                if ident is not None:
                    seen.add(ident)
            page.append(record)
            self.listed = len(seen)
            if len(page) >= size:
                yield page
                page = []
        if page:
            yield page
        listing.complete = self.complete and self.cut is None

    def _collections(self, page_size: int) -> Iterator[tuple[Any, str, str]]:
        """(collection document, base URL, fallback landing page) of every collection."""
        path = urlsplit(self.url).path.rstrip("/")
        if path.endswith("/collections"):
            yield from self._api(_with_params(self.url, {"limit": page_size}), None)
            return
        doc = self._get(self.url)
        if isinstance(doc.get("collections"), list):
            yield from self._api(self.url, doc)
            return
        data = [u for u in (_resolve(self.url, link["href"]) for link in links_of(doc, "data")) if u]
        if not is_collection(doc) and (data or conforms_to_collections(doc)):
            href = data[0] if data else self.url.rstrip("/") + "/collections"
            yield from self._api(_with_params(href, {"limit": page_size}), None)
            return
        yield from self._static(doc)

    def _api(self, url: str, first: dict | None) -> Iterator[tuple[Any, str, str]]:
        self.mode = "api"
        listing_url = url.split("?", 1)[0].rstrip("/")
        seen_urls: set[str] = set()
        seen_pages: set[tuple[str, ...]] = set()
        ids: set[str] = set()
        expected: int | None = None
        for n in range(self.max_pages):
            seen_urls.add(url)
            page = first if (n == 0 and first is not None) else self._get(url)
            collections = page.get("collections")
            if not isinstance(collections, list):
                raise SourceError(f"{self.portal}: GET {scrub_url(url)}: the answer has no collections list: "
                                  "not a STAC API's /collections page")
            total = page_total(page)
            if total is not None:
                self.total = total
                # a collection removed while the pages are read shifts an offset-paged listing back
                # past one it never shows: the largest total of any page must be reached
                expected = max(expected or 0, total)
            key = tuple(collection_id(c) or f"#{i}" for i, c in enumerate(collections))
            if collections and key in seen_pages:
                self._cut(f"{scrub_url(url)} repeats the collections of an earlier page")
                return
            seen_pages.add(key)
            for doc in collections:
                ident = collection_id(doc)
                if ident is not None:
                    ids.add(ident)
                yield doc, url, f"{listing_url}/{ident}" if ident else listing_url
            nexts = links_of(page, "next")
            if not collections or not nexts:
                if expected is not None and len(ids) < expected:
                    self._cut(f"the listing ended at {len(ids)} distinct collections of the {expected} its pages "
                              "counted")
                    return
                self.complete = True
                return
            link = nexts[0]
            method = link.get("method", "GET")
            if not isinstance(method, str) or method.upper() != "GET":
                raise SourceError(f"{self.portal}: GET {scrub_url(url)}: its next page must be requested with "
                                  f"method {str(method)[:20]!r} (a body of search parameters); Harvester follows "
                                  "next links by GET only")
            nxt = _resolve(url, link["href"])
            if nxt is None:
                self._cut(f"the next link of {scrub_url(url)} ({str(link['href'])[:200]!r}) is not an http(s) URL")
                return
            if _host(nxt) != _host(url):
                self._cut(f"the next link of {scrub_url(url)} leaves for another host ({scrub_url(nxt)})")
                return
            if nxt in seen_urls:
                self._cut(f"the next link of {scrub_url(url)} goes back to {scrub_url(nxt)}, already read")
                return
            url = nxt
        self._cut(f"more than {self.max_pages} pages; stopped before {scrub_url(url)}")

    def _static(self, root: dict) -> Iterator[tuple[Any, str, str]]:
        self.mode = "static"
        queue: deque[tuple[str, dict | None, int]] = deque([(self.url, root, 0)])
        read: set[str] = {self._key(self.url)}
        host = _host(self.url)
        foreign = loops = 0
        documents = 0
        broken = False
        while queue:
            url, doc, depth = queue.popleft()
            if doc is None:
                if documents >= self.max_documents:
                    self._cut(f"more than {self.max_documents} documents; {len(queue) + 1} child links left unread")
                    return
                try:
                    doc = self._get(url, child=True)
                except ChildFailed as exc:
                    log.warning("%s; that branch of the catalog is unread, nothing removed", exc)
                    broken = True
                    continue
            documents += 1
            if is_collection(doc):
                yield doc, url, url
            children = links_of(doc, "child")
            if children and depth >= self.max_depth:
                self._cut(f"{scrub_url(url)} is {depth} child links deep; its {len(children)} children are unread")
                return
            for link in children:
                child = _resolve(url, link["href"])
                if child is None:
                    log.warning("%s: %s: child link %r is not an http(s) URL; not followed", self.portal,
                                scrub_url(url), str(link["href"])[:200])
                    continue
                if _host(child) != host:
                    foreign += 1
                    continue
                key = self._key(child)
                if key in read:
                    loops += 1
                    continue
                read.add(key)
                queue.append((child, None, depth + 1))
        if foreign:
            log.warning("%s: %d child links lead to other hosts: not this catalog's, not followed", self.portal,
                        foreign)
        if loops:
            log.warning("%s: %d child links lead back to documents already read (a loop): each read once", self.portal,
                        loops)
        if broken:
            self.cut = "a child document could not be read"
            return
        self.complete = True

    @staticmethod
    def _key(url: str) -> str:
        parts = urlsplit(url)
        return urlunsplit((parts.scheme.lower(), parts.netloc.lower(), parts.path, parts.query, ""))

    def _cut(self, why: str) -> None:
        log.warning("%s: %s; listing cut there, nothing removed", self.portal, why)
        self.cut = why
