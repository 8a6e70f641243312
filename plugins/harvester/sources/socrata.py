"""Socrata (Tyler Data & Insights) portals through the Discovery API: ``type: socrata``.

The catalogue of a portal is ``GET https://{domain}/api/catalog/v1?domains={domain}&only=dataset``
(also served for every domain by ``api.us.socrata.com`` / ``api.eu.socrata.com``); each answer is
``{"results": [...], "resultSetSize": N, "timings": {...}}``, one result per asset::

    {"resource": {"id": "6iiy-9s97", "name", "description", "attribution", "type", "updatedAt",
                  "createdAt", "metadata_updated_at", "data_updated_at", "page_views", "columns_*", ...},
     "classification": {"categories", "tags", "domain_category", "domain_tags", "domain_metadata"},
     "metadata": {"domain", "license"}, "permalink", "link", "owner": {...}, "creator": {...}}

The portal URL in portals.yaml is the portal itself (``https://data.cityofchicago.org``: its
catalogue and its host as ``domains``), or a Discovery API URL whose ``domains=`` says which
portal (``https://api.us.socrata.com/api/catalog/v1?domains=data.cityofchicago.org``).

Each result becomes a CKAN-shaped package (``to_package``): title, description, tags (domain tags
then Socrata's own), groups (the domain category then Socrata's categories), the organisation (the
attribution, else the owner's name, else the domain), the licence, ``metadata_modified`` =
``updatedAt``, the landing page (permalink, else link) and two resources: the dataset's SODA
endpoint ``https://{domain}/resource/{id}.json`` and its CSV export. Every other field goes to the
extras (so the metadata hash sees it) except what changes without the dataset changing: page views,
download counts and the update timestamps (``updatedAt`` is ``metadata_modified``).

Paging and since: the Discovery API pages with ``limit``/``offset`` only up to offset 10,000 (it
answers 400 past that window). Its deep paging is ``scroll_id``: the results come ordered by id and
each request passes ``scroll_id=<the id of the last result of the previous page>`` with ``limit``
and no offset (the first page an empty ``scroll_id``); the answer holds the results strictly after
that id, the end being an empty page. (Its reference is
https://socratadiscovery.docs.apiary.io/, which the search corpora did not hold: these semantics
are those issue 23 gives; dev.socrata.com/docs/paging only covers SODA's ``$limit``/``$offset``.
Sending an empty ``scroll_id`` for the first page is our reading, not checked on the live API.)
A full listing (``since=None``) and ``list_ids`` scroll, so a catalogue of any size is read to
its end.

A listing is complete only on proof (issue 36). ``resultSetSize`` is capped: the 2025 recordings
answer exactly 10000 for queries matching more (2018's answered 150680), so a count of 10,000 or
more means "at least that many" (``Capabilities.count``, sources/__init__.py): only a count below
the cap is exact, and only an exact count reached ends a listing. Otherwise the end is an empty page
(asked for after the last non-empty one). A page shorter than asked is not the end: the server may
cap the page size below ``limit``; the listing asks on, and the empty page after it is the proof
(one more request for a catalogue of 10,000 or more).
The API has NO modified-since filter. It orders, though: ``order=updatedAt DESC``. A listing with
``since`` reads newest first with offsets and stops at the first dataset not updated after
``since`` (what other Socrata harvesters do); the listing is then not the whole catalogue
(``listing.complete`` stays False: nothing is removed). An incremental listing that would pass the
offset window before reaching ``since`` raises ``FilterRejected`` (the pipeline then lists
everything, by scrolling). So the kind's capabilities say ``incremental=False`` (the portal does
not filter; the pipeline applies removals only after a complete listing), and every run costs only
the pages down to ``since`` (the pipeline keeps an incremental run's mode when its listing is
not complete). A portal that ignores the ordering (a dataset newer than the one
before it, anywhere in the pages read, the rest of the page holding the stop included) cannot be
cut at ``since``: ``FilterRejected`` (the pipeline lists everything instead).

Reconciliation (``capabilities.reconcile``): ``count`` is ``resultSetSize`` of a one-result page,
so an incremental run notices a deletion (or anything its cut listing missed) for one request, on a
portal of fewer than 10,000 datasets (above, the count is capped and says only "at least 10,000":
the count check judges no drift from it, see domain/run.py ``count_drift``);
``fetch_by_ids`` uses the API's ``ids=`` filter; ``list_ids`` has no narrower answer to ask for and
sends the whole results (the pipeline stages them), refusing a listing it could not read to its end.

A page that brings nothing new (all its ids already listed, an empty page before
``resultSetSize`` was reached), a scroll whose ``scroll_id`` does not advance (the last id of a page
not after the previous one) or a scrolled page repeating ids ends the listing with a warning,
marked incomplete so that nothing is removed on the strength of it.
"""
from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Mapping
from datetime import datetime
from typing import Any
from urllib.parse import parse_qs, urlsplit, urlunsplit

from harvester.config.portals import SOCRATA
from harvester.domain.dataset import (DatasetRecord, clean_text, failed, normalize_url, package_record,
                                      parse_timestamp, screened_as_published, sha256_hex, slug)
from harvester.domain.outcomes import problem
from harvester.http import scrub_url
from harvester.sources.base import (BadRecord, Capabilities, CountsTraffic, FilterRejected, IdPage, Listing,
                                    SourceError, capped_count, coded, to_ms)
from harvester.sources.json_stream import answer_json

log = logging.getLogger(__name__)

CATALOG_PATH = "/api/catalog/v1"
ORDER = "updatedAt DESC"
MAX_WINDOW = 10_000   # the Discovery API answers offset + limit up to 10,000
MAX_LIMIT = 1_000     # a polite page (the API allows up to 10,000)
COUNT_CAP = 10_000    # resultSetSize never says more (2025 answers: exactly 10000 for a query matching more)

# Fields that change without the dataset changing (views, downloads, the data refresh time), or
# are already mapped: kept out of the extras so the metadata hash does not see them.
_VOLATILE = frozenset({"page_views", "download_count", "updatedAt", "data_updated_at", "metadata_updated_at"})
_RESOURCE_MAPPED = frozenset({"id", "name", "description", "attribution", "createdAt"})
_TOP_MAPPED = frozenset({"resource", "classification", "metadata", "permalink"})


class InvalidAnswer(SourceError, ValueError):
    """The Discovery API answered something that is not a catalogue page."""


def _text(value: Any) -> str | None:
    return value.strip() if isinstance(value, str) and value.strip() else None


def _as_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, ensure_ascii=False,
                                                           separators=(",", ":"))


def _strings(*lists: Any) -> list[str]:
    out: dict[str, None] = {}
    for values in lists:
        if isinstance(values, str):
            values = [values]
        for v in values or []:
            if isinstance(v, str) and v.strip():
                out[v.strip()] = None
    return list(out)


def _updated(result: Mapping) -> datetime | None:
    resource = result.get("resource") if isinstance(result.get("resource"), Mapping) else {}
    return parse_timestamp(resource.get("updatedAt"))


def result_id(result: Any) -> str | None:
    if not isinstance(result, Mapping) or not isinstance(result.get("resource"), Mapping):
        return None
    return _text(result["resource"].get("id"))


def to_package(result: Mapping, domain: str | None = None) -> dict:
    """A Discovery API result as a CKAN-shaped package (see the module's docstring). Raises
    ``BadRecord`` naming the dataset when it has no id or no name."""
    resource = result.get("resource")
    if not isinstance(resource, Mapping):
        raise BadRecord("not-an-object", "result has no 'resource' object", "resource", resource)
    ident = _text(resource.get("id"))
    if ident is None:
        raise BadRecord("no-identifier", f"dataset {resource.get('name')!r} has no resource.id", "resource.id",
                        resource.get("id"))
    title = _text(resource.get("name"))
    if title is None:
        raise BadRecord("no-title", f"dataset {ident}: no name", "resource.name", resource.get("name"))
    classification = result.get("classification") if isinstance(result.get("classification"), Mapping) else {}
    metadata = result.get("metadata") if isinstance(result.get("metadata"), Mapping) else {}
    owner = result.get("owner") if isinstance(result.get("owner"), Mapping) else {}
    host = _text(metadata.get("domain")) or domain
    org = _text(resource.get("attribution")) or _text(owner.get("display_name")) or host
    landing = _text(result.get("permalink")) or _text(result.get("link"))
    resources = []
    if host:
        resources = [
            {"url": f"https://{host}/resource/{ident}.json", "format": "JSON", "name": "SODA API endpoint"},
            {"url": f"https://{host}/api/views/{ident}/rows.csv?accessType=DOWNLOAD", "format": "CSV",
             "name": "CSV export"},
        ]
    extras = []
    for key, value in resource.items():
        if key not in _RESOURCE_MAPPED and key not in _VOLATILE and value not in (None, [], {}):
            extras.append({"key": f"resource.{key}", "value": _as_text(value)})
    for key, value in classification.items():
        if key == "domain_metadata" and isinstance(value, list):
            for item in value:
                if isinstance(item, Mapping) and _text(item.get("key")):
                    extras.append({"key": f"domain_metadata.{item['key'].strip()}",
                                   "value": _as_text(item.get("value"))})
        elif key not in ("domain_tags", "tags", "domain_category", "categories") and value not in (None, [], {}):
            extras.append({"key": f"classification.{key}", "value": _as_text(value)})
    for key, value in metadata.items():
        if key not in ("license",) and value not in (None, [], {}):
            extras.append({"key": f"metadata.{key}", "value": _as_text(value)})
    for key, value in result.items():
        if key not in _TOP_MAPPED and value not in (None, [], {}):
            extras.append({"key": key, "value": _as_text(value)})
    return {
        "id": ident,
        "name": ident,
        "title": title,
        "notes": resource.get("description") if isinstance(resource.get("description"), str) else None,
        "tags": [{"name": t} for t in _strings(classification.get("domain_tags"), classification.get("tags"))],
        "groups": [{"name": g} for g in _strings(classification.get("domain_category"),
                                                 classification.get("categories"))],
        "organization": {"title": org, "name": slug(org)} if org else None,
        "license_id": _text(metadata.get("license")),
        "metadata_modified": resource.get("updatedAt"),
        "metadata_created": resource.get("createdAt"),
        "url": landing,
        "resources": resources,
        "extras": extras,
    }


@screened_as_published(result_id)
def normalize(result: Any, catalog_url: str, domain: str | None = None) -> DatasetRecord:
    """A Discovery API result as a DatasetRecord; an unusable one comes back failed, saying why (one
    too deep or too large fails before the mapping, a NaN is null before it writes extras:
    ``screened_as_published``)."""
    if not isinstance(result, Mapping):
        return failed(None, result, [problem("not-an-object", f"result is a {type(result).__name__}, not an object")])
    try:
        pkg = to_package(result, domain)
    except ValueError as exc:
        return failed(result_id(result), result, coded(exc), prefix=f"{scrub_url(catalog_url)}: ")
    if pkg["url"] and pkg["url"].lower().startswith(("http://", "https://")):
        url, url_hash = pkg["url"], None
    else:
        url = f"{catalog_url}#{pkg['id']}"
        url_hash = sha256_hex(f"{normalize_url(catalog_url)}#{pkg['id']}")
    title, description = clean_text(pkg["title"]), clean_text(pkg["notes"])
    org = pkg["organization"]
    return package_record(pkg, source_id=pkg["id"], name=pkg["name"], url=url, url_hash=url_hash, title=title,
                          description=description, tags=sorted({t["name"] for t in pkg["tags"]}),
                          organization=org["title"] if org else None, notes_text=description)


def catalogue_of(url: str) -> tuple[str, str]:
    """(the Discovery API URL, the domain) of a portal URL (see the module's docstring)."""
    parts = urlsplit(url.strip())
    query = parse_qs(parts.query)
    path = parts.path.rstrip("/")
    domain = (query.get("domains") or [None])[0] or parts.hostname or ""
    base = path[:-len(CATALOG_PATH)] if path.endswith(CATALOG_PATH) else path
    return urlunsplit((parts.scheme, parts.netloc, base + CATALOG_PATH, "", "")), domain.split(",")[0].strip()


class SocrataSource(CountsTraffic):
    """A Socrata portal's datasets through the Discovery API, fetched with ``fetcher``
    (harvester.http.HttpFetcher). ``total``: ``resultSetSize`` of the last answer."""

    kind = SOCRATA
    capabilities = Capabilities(reconcile=True, count=capped_count(COUNT_CAP))   # as sources/__init__.py says

    def __init__(self, url: str, *, fetcher, portal: str | None = None):
        self.url = url
        self.catalog_url, self.domain = catalogue_of(url)
        self.fetcher = fetcher
        self.portal = portal or self.domain
        self.total: int | None = None

    def __repr__(self) -> str:
        return f"SocrataSource({scrub_url(self.catalog_url)!r}, domain={self.domain!r})"


    def _count_reached(self, listed: int) -> bool:
        """Whether ``listed`` results prove the listing whole: the last ``resultSetSize`` is exact
        (below the cap) and that many were listed. A capped count proves nothing."""
        return self.capabilities.count.is_exact(self.total) and listed >= self.total

    # -- one page --------------------------------------------------------------------------------
    def _get(self, params: dict) -> dict:
        where = f"portal {self.portal}: GET {scrub_url(self.catalog_url)}"

        def parse(resp):
            if resp.status_code != 200:
                raise SourceError(f"{where}?{_query(params)} answered HTTP {resp.status_code} "
                                  f"{resp.reason or ''}".rstrip())
            try:
                body = answer_json(resp)  # (a page of any depth: sources/json_stream.py)
            except ValueError as exc:
                raise InvalidAnswer(f"{where}?{_query(params)}: not JSON ({len(resp.content)} bytes: "
                                    f"{resp.text[:80]!r})") from exc
            if not isinstance(body, Mapping) or not isinstance(body.get("results"), list):
                raise InvalidAnswer(f"{where}?{_query(params)}: no 'results' list: not a Discovery API answer")
            return body

        return self.fetcher.get(self.catalog_url, params=params, parse=parse, what=f"{where}?{_query(params)}")

    def _params(self, limit: int, offset: int) -> dict:
        return {"domains": self.domain, "search_context": self.domain, "only": "dataset", "order": ORDER,
                "limit": limit, "offset": offset}

    def _scroll_params(self, limit: int, scroll_id: str) -> dict:
        return {"domains": self.domain, "search_context": self.domain, "only": "dataset", "limit": limit,
                "scroll_id": scroll_id}

    def _scroll(self, page_size: int, listing: Listing) -> Iterator[list[DatasetRecord]]:
        """Every dataset, ordered by id, paged by ``scroll_id`` (see the module's docstring):
        ``listing.complete`` only once the end was read."""
        limit = max(1, min(page_size, MAX_LIMIT))
        seen: set[str] = set()
        scroll_id = ""
        while True:
            body = self._get(self._scroll_params(limit, scroll_id))
            size = body.get("resultSetSize")
            if isinstance(size, int) and not isinstance(size, bool):
                self.total = size
            results = body["results"]
            if not results:
                if self.total is not None and len(seen) < self.total:
                    log.warning("portal %s: an empty page after scroll_id %r with %d of %d results listed: the "
                                "listing stops there and is incomplete (nothing is removed)", self.portal,
                                scroll_id, len(seen), self.total)
                    return
                listing.complete = True  # the end of the catalogue: everything was listed
                return
            ids = [result_id(r) for r in results]
            last = next((i for i in reversed(ids) if i is not None), None)
            if last is None or (scroll_id and last <= scroll_id):
                log.warning("portal %s: the scroll_id did not advance (page after %r ends at %r): the listing "
                            "stops there and is incomplete (nothing is removed)", self.portal, scroll_id, last)
                return
            page: list[DatasetRecord] = []
            repeated = 0
            for ident, result in zip(ids, results):
                if ident is not None:
                    if ident in seen:
                        repeated += 1
                        continue
                    seen.add(ident)
                page.append(normalize(result, self.catalog_url, self.domain))
            if page:
                yield page
            if repeated:
                log.warning("portal %s: the page after scroll_id %r repeats %d datasets already listed: the "
                            "listing stops there and is incomplete (nothing is removed)", self.portal, scroll_id,
                            repeated)
                return
            if self._count_reached(len(seen)):
                listing.complete = True  # an exact count, reached: everything was listed
                return
            # A short page is not the end (the server may cap the page size): the empty page after
            # the last one is.
            scroll_id = last

    # -- the protocol ----------------------------------------------------------------------------
    def iter_records(self, since: datetime | None, page_size: int, listing: Listing,
                     validators: dict | None = None) -> Iterator[list[DatasetRecord]]:
        """Pages of records: all of them ordered by id, by ``scroll_id`` (``listing.complete``
        once the last page was read), or, newest first, those updated after ``since`` (the listing
        then stops at the first older one and is not complete). See the module's docstring for the
        loop guards."""
        if since is None:
            yield from self._scroll(page_size, listing)
            return
        limit = max(1, min(page_size, MAX_LIMIT))
        since_ms = to_ms(since) if since is not None else None
        seen: set[str] = set()
        offset = 0
        previous: datetime | None = None
        listing.complete = False
        while True:
            if offset >= MAX_WINDOW:
                raise FilterRejected(
                    f"portal {self.portal}: {scrub_url(self.catalog_url)} pages order={ORDER} only {MAX_WINDOW} "
                    f"results deep and {offset} were read without reaching datasets not updated since "
                    f"{since.isoformat()}; it cannot be listed by update time (a full listing scrolls instead)")
            asked = min(limit, MAX_WINDOW - offset)  # offset + limit may not pass the window
            body = self._get(self._params(asked, offset))
            size = body.get("resultSetSize")
            if isinstance(size, int) and not isinstance(size, bool):
                self.total = size
            results = body["results"]
            if not results:
                if self.total is not None and offset < self.total:
                    log.warning("portal %s: an empty page at offset %d of %d results: the listing stops there "
                                "and is incomplete (nothing is removed)", self.portal, offset, self.total)
                    return
                listing.complete = True  # the end of the catalogue: everything was listed
                return
            page: list[DatasetRecord] = []
            new = 0
            stop = False
            for result in results:
                ident = result_id(result)
                updated = _updated(result) if isinstance(result, Mapping) else None
                if updated is not None:
                    if previous is not None and to_ms(updated) > to_ms(previous):
                        if since is not None:
                            raise FilterRejected(
                                f"portal {self.portal}: {scrub_url(self.catalog_url)} ignored order={ORDER}: dataset "
                                f"{ident} (updated {updated.isoformat()}) came after one updated "
                                f"{previous.isoformat()}; it cannot be listed by update time")
                    previous = updated
                if stop:
                    continue  # past since: the rest of the page is only checked for its order
                if since_ms is not None and updated is not None and to_ms(updated) <= since_ms:
                    stop = True
                    continue
                if ident is not None:
                    if ident in seen:
                        continue
                    seen.add(ident)
                new += 1
                page.append(normalize(result, self.catalog_url, self.domain))
            if page:
                yield page
            if stop:
                log.info("portal %s: reached datasets not updated since %s after %d listed", self.portal,
                         since.isoformat(), len(seen))
                listing.reached_since = True
                return
            if new == 0:
                log.warning("portal %s: the page at offset %d repeats datasets already listed: the listing stops "
                            "there and is incomplete (nothing is removed)", self.portal, offset)
                return
            offset += len(results)
            if self._count_reached(offset):
                listing.complete = True  # an exact count reached, never cut at since: everything was listed
                return
            # a short page is not the end (the server may cap the page size): the empty page after it is

    # -- reconciliation (sources/base.py) --------------------------------------------------------
    def count(self) -> int | None:
        """``resultSetSize`` of a one-result page: how many datasets the portal lists, exact only
        below the API's cap of 10,000 (``capabilities.count``); at the cap it means "at least"."""
        params = self._params(1, 0)
        del params["order"]
        size = self._get(params).get("resultSetSize")
        return size if isinstance(size, int) and not isinstance(size, bool) else None

    def list_ids(self, page_size: int) -> Iterator[IdPage]:
        """Every dataset's id and ``updatedAt``. The Discovery API cannot narrow its answer to
        ids, so the pages carry the whole records (staged by the pipeline as they are). A listing
        that cannot be read to its end (a loop, the API's window) raises ``SourceError``: a partial
        one would make every dataset it missed look removed."""
        listing = Listing()
        for page in self.iter_records(None, page_size, listing):
            ids = [(r.source_id, to_ms(r.metadata_modified) if r.metadata_modified else None)
                   for r in page if r.source_id is not None]
            yield IdPage(ids=ids, unusable=sum(r.source_id is None for r in page), records=page,
                         ignored="a narrower answer (the Discovery API sends whole results)")
        if not listing.complete:
            raise SourceError(f"portal {self.portal}: the listing of {scrub_url(self.catalog_url)} could not be read "
                              f"to its end; no reconciliation on a partial listing")

    def fetch_by_ids(self, ids: list[str], per_request: int = 100) -> Iterator[list[DatasetRecord]]:
        """The results of ``ids`` through the Discovery API's ``ids=`` filter, ``per_request`` a
        request; ids it no longer shows are left out."""
        wanted = [i for i in ids if i]
        step = max(1, min(per_request, MAX_LIMIT))
        for start in range(0, len(wanted), step):
            chunk = wanted[start:start + step]
            params = {"domains": self.domain, "search_context": self.domain, "only": "dataset",
                      "ids": ",".join(chunk), "limit": len(chunk), "offset": 0}
            asked = set(chunk)
            page = [normalize(r, self.catalog_url, self.domain) for r in self._get(params)["results"]
                    if result_id(r) in asked]
            if page:
                yield page


def _query(params: dict) -> str:
    return "&".join(f"{k}={v}" for k, v in params.items())
