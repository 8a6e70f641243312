"""OpenDataSoft portals (the Explore API v2.1 catalogue) as a source: ``type: opendatasoft``.

The catalogue is ``GET <portal>/api/explore/v2.1/catalog/datasets`` answering
``{"total_count": N, "results": [dataset, ...]}``; a dataset is ``dataset_id``, ``dataset_uid``,
``has_records``, ``features``, ``fields``, ``attachments`` and ``metas`` (``default``: title,
description, keyword, theme, publisher, license, modified, data_processed, metadata_processed,
language...; other templates such as ``dcat``, ``inspire``, ``custom``). The v2.0 shape
(``datasets[*].dataset`` with ``links``) and v1.0's (``datasetid``, flat ``metas``) are read too.

Each dataset becomes a CKAN-shaped package (``to_package``): ``metas.default``'s title, description
(HTML cleaned), keywords as tags, themes as groups, publisher as organisation, licence, modified
(``metadata_modified``) and created dates; resources: the CSV and JSON exports and the records
endpoint; the landing page ``<portal>/explore/dataset/<id>/``. Everything else (the default
template's other keys, every other template key by key, fields, features, attachments) goes to
``extras``, so that the metadata hash sees an edit anywhere.

Listing, by documented means only (help.opendatasoft.com/apis/ods-explore-v2, the OpenAPI document
of opendatasoft-explore-sdk; ../shared/portal-samples/README.md sums it up). The records endpoint
pages with ``limit`` (at most 100) and ``offset``, ordered by ``dataset_id``, but only while
``offset + limit`` stays within 10,000; past that the documentation sends one to the exports
endpoint, ``GET <portal>/api/explore/v2.1/catalog/exports/json`` (the same ``where``, ``select`` and
``order_by``, no limit: the whole selection as one JSON array). ODSQL compares text fields with
``=`` only, so there is no keyset on ``dataset_id`` to page on with. So the first page's
``total_count`` decides: below 10,000 the listing pages on; at 10,000 or more (a total exactly at
the cap may be one that stopped there) the rest comes from one export, streamed and parsed a
dataset at a time (ijson), never held whole, the datasets of the first page not listed twice. A
catalogue that grows past the window while it is paged goes on through the export too.

A listing is complete only on proof that the API has no more: an export whose JSON array closed
and whose body ended cleanly; an empty page; a short page whose own ``total_count`` says it was
the last one. A short page alone is not: a page shorter than asked while ``total_count`` says more
is followed by the next one. An export cut short is asked again (the datasets already listed
skipped) as often as the fetcher retries, then fails the listing (``RetriesExhausted``, transient).
An export is one request, so ``HARVESTER_FETCH_DEADLINE_SECS`` and
``HARVESTER_FETCH_MAX_STREAM_BYTES`` (http/guard.py) bound the whole of it. A page
that brings no dataset not already listed ends the listing with a warning, incomplete
(``listing.complete`` False): after a full one the pipeline removes nothing. An identifier listing
so cut fails (``ListingCut``): it cannot be reconciled with.

Incremental: ``where=default.modified >= date'<since>'`` (ODSQL, as the ODS documentation writes it),
paged or exported like a full listing, so 10,000 changed datasets or more come through the export.
A portal that answers a dataset modified before ``since`` ignored the filter: ``FilterRejected``
(the pipeline falls back to a full listing). A 400 to the filtered request is a refused filter too.

Reconciliation (sources/base.py): ``count`` is one ``limit=0`` request (``total_count``);
``list_ids`` lists the catalogue narrowed with ``select=dataset_id,modified`` (paged, or exported
past 10,000: the export takes ``select`` too; whole datasets sent anyway are used as records);
``fetch_by_ids`` asks ``where dataset_id = "a" OR dataset_id = "b"...`` (``=``, the one comparison
ODSQL has for text), 100 ids a request at most, and a portal answering other datasets ignored it
(``FilterRejected``).

All requests go through ``harvester.http.HttpFetcher`` (5xx, 429 and non-JSON 2xx bodies retried);
any other 4xx is terminal, named with the portal and the URL.
"""
from __future__ import annotations

import json
import logging
from datetime import datetime
from typing import Any, Iterator, Mapping
from urllib.parse import quote, urlsplit, urlunsplit

import ijson
from urllib3.exceptions import HTTPError as Urllib3Error

from harvester.config.portals import OPENDATASOFT
from harvester.domain.dataset import (DatasetRecord, clean_text, failed, package_record, parse_timestamp,
                                      screened_as_published, slug)
from harvester.http import RetriesExhausted, Retryable, scrub_url, streamed_bytes
from harvester.http.guard import failure_text
from harvester.sources.base import (BadRecord, Capabilities, CountsTraffic, FilterRejected, IdPage, Listing,
                                    SourceError, coded, to_ms)
from harvester.sources.json_stream import StandIns, answer_json, build

log = logging.getLogger(__name__)

KIND = OPENDATASOFT
API = "/api/explore/v2.1"
EXPORT = f"{API}/catalog/exports/json"   # the whole catalogue (or a where's selection), one JSON array
MAX_LIMIT = 100          # the Explore API's largest page
OFFSET_CAP = 10_000      # offset + limit may not exceed this
SELECT_IDS = "dataset_id,modified"   # an identifier listing: ``modified`` is the basic meta default.modified
_MAPPED_DEFAULT = frozenset({"title", "description", "keyword", "theme", "publisher", "license", "modified"})
_MAPPED_TOP = frozenset({"dataset_id", "datasetid", "metas", "links"})


def portal_root(url: str) -> str:
    """The portal's address without any API path or trailing slash (``https://x.ods.com``)."""
    parts = urlsplit(url.strip())
    path = parts.path
    for marker in ("/api/explore/", "/api/v2", "/api/datasets", "/explore/"):
        at = path.find(marker)
        if at >= 0:
            path = path[:at]
    return urlunsplit((parts.scheme, parts.netloc, path.rstrip("/"), "", ""))


# -- mapping --------------------------------------------------------------------------------------
def _as_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, ensure_ascii=False,
                                                           separators=(",", ":"))


def unwrap(item: Any) -> Any:
    """The dataset object of a result: v2.1 is the object itself, v2.0 wraps it in ``dataset``."""
    if isinstance(item, Mapping) and "dataset" in item and isinstance(item["dataset"], Mapping) \
            and "dataset_id" not in item:
        return item["dataset"]
    return item


def dataset_id(ds: Any) -> str | None:
    if not isinstance(ds, Mapping):
        return None
    value = ds.get("dataset_id", ds.get("datasetid"))
    if isinstance(value, str) and value.strip():
        return value.strip()
    return None


def metas_of(ds: Mapping) -> tuple[dict, dict]:
    """(the default template, the other templates). v1.0's flat ``metas`` is the default template."""
    metas = ds.get("metas")
    if not isinstance(metas, Mapping):
        return {}, {}
    if isinstance(metas.get("default"), Mapping):
        return dict(metas["default"]), {k: v for k, v in metas.items() if k != "default"}
    return dict(metas), {}


def _labels(value: Any) -> list[str]:
    """Keywords or themes: a list of strings, or one string, which is one label (ODS writes a single
    keyword so, and a theme's name may hold commas: "Culture, Heritage"). Unique, in order."""
    if value is None:
        return []
    items = value if isinstance(value, list) else [value]
    out: dict[str, None] = {}
    for item in items:
        if item is None:
            continue
        text = item.strip() if isinstance(item, str) else _as_text(item)
        if text:
            out[text] = None
    return list(out)


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, list):  # a multi-valued publisher or licence: joined
        value = ", ".join(_as_text(v) for v in value if v is not None)
    return value if isinstance(value, str) else _as_text(value)


def _quoted(ident: str) -> str:
    """``ident`` percent-encoded for a path, a lone surrogate (which UTF-8 cannot encode) as the
    three bytes ``surrogatepass`` gives it: the mapping goes on, and the record fails on its
    identifier (``unstorable-identifier``, domain/dataset.py) rather than as an encoding error."""
    return quote(ident, safe="@", errors="surrogatepass")


def landing(root: str, ident: str) -> str:
    return f"{root}/explore/dataset/{_quoted(ident)}/"


def resources(root: str, ds: Mapping, ident: str) -> list[dict]:
    base = f"{root}{API}/catalog/datasets/{_quoted(ident)}"
    out = [{"url": f"{base}/exports/csv", "format": "CSV", "name": "Export CSV"},
           {"url": f"{base}/exports/json", "format": "JSON", "name": "Export JSON"}]
    if ds.get("has_records", True) is not False:
        out.append({"url": f"{base}/records", "format": "JSON", "name": "Records (Explore API)"})
    return out


def to_package(item: Any, root: str) -> dict:
    """A catalogue result as a CKAN-shaped package. Raises ``BadRecord`` naming the dataset when it
    cannot be used (no dataset_id, no title)."""
    ds = unwrap(item)
    if not isinstance(ds, Mapping):
        raise BadRecord("not-an-object", f"{root}: a catalogue result is {type(ds).__name__}, not a JSON object")
    ident = dataset_id(ds)
    if ident is None:
        raise BadRecord("no-identifier", f"{root}: a catalogue result has no dataset_id", "dataset_id")
    default, others = metas_of(ds)
    title = default.get("title")
    if not isinstance(title, str) or not clean_text(title):
        raise BadRecord("no-title", f"{root}: dataset {ident!r} has no title", "metas.default.title", title)
    publisher = _text(default.get("publisher"))
    extras = [{"key": k, "value": _as_text(v)} for k, v in sorted(default.items()) if k not in _MAPPED_DEFAULT]
    for template, values in sorted(others.items()):
        if isinstance(values, Mapping):
            extras += [{"key": f"metas.{template}.{k}", "value": _as_text(v)} for k, v in sorted(values.items())]
        else:
            extras.append({"key": f"metas.{template}", "value": _as_text(values)})
    extras += [{"key": k, "value": _as_text(v)} for k, v in sorted(ds.items()) if k not in _MAPPED_TOP]
    dcat = others.get("dcat") if isinstance(others.get("dcat"), Mapping) else {}
    created = default.get("created") or default.get("issued") or dcat.get("created") or dcat.get("issued")
    return {
        "id": ident,
        "name": ident,
        "title": title.strip(),
        "notes": _text(default.get("description")),
        "tags": [{"name": k} for k in _labels(default.get("keyword"))],
        "groups": [{"name": t} for t in _labels(default.get("theme"))],
        "organization": {"title": publisher.strip(), "name": slug(publisher)} if publisher and publisher.strip()
        else None,
        "license_id": _text(default.get("license")),
        "metadata_modified": _text(default.get("modified")),
        "metadata_created": _text(created),
        "url": landing(root, ident),
        "resources": resources(root, ds, ident),
        "extras": extras,
    }


@screened_as_published(lambda item: dataset_id(unwrap(item)))
def normalize(item: Any, root: str) -> DatasetRecord:
    """A catalogue result as a DatasetRecord; an unusable one comes back failed, saying why (one
    too deep or too large fails before the mapping, a NaN is null before it writes extras:
    ``screened_as_published``)."""
    try:
        pkg = to_package(item, root)
    except ValueError as exc:
        return failed(dataset_id(unwrap(item)), item, coded(exc))
    org = pkg["organization"]
    return package_record(pkg, source_id=pkg["id"], name=pkg["name"], url=pkg["url"], title=clean_text(pkg["title"]),
                          description=clean_text(pkg["notes"]), tags=sorted({t["name"] for t in pkg["tags"]}),
                          organization=org["title"] if org else None)


class ListingCut(SourceError):
    """A full listing that could not be completed (a page that repeats datasets already listed)."""


class ExportCut(Exception):
    """An export's body ended before its JSON array did (the connection broke, or the document is
    cut short): what it listed so far is not the whole selection."""


def modified_of(item: Mapping) -> datetime | None:
    """A result's ``default.modified`` (a narrowed answer has it at the top level)."""
    value = metas_of(item)[0].get("modified") if isinstance(item.get("metas"), Mapping) else \
        item.get("modified", item.get("default.modified"))
    return parse_timestamp(value)


# -- the source -----------------------------------------------------------------------------------
def _odsql_string(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def since_second(since: datetime) -> datetime:
    """``since`` in UTC, down to the second: ODSQL date literals are written to the second (ODS's
    ``modified`` values are too), and the earlier bound only widens the listing."""
    return to_ms(since).replace(microsecond=0)


def modified_filter(since: datetime) -> str:
    """The ODSQL condition of an incremental listing."""
    return f"default.modified >= date'{since_second(since).strftime('%Y-%m-%dT%H:%M:%SZ')}'"


class OpenDataSoftSource(CountsTraffic):
    """An OpenDataSoft portal at ``url`` (its address; an API path in it is ignored), read through
    ``fetcher`` (harvester.http.HttpFetcher)."""

    kind = KIND
    capabilities = Capabilities(incremental=True, reconcile=True)

    def __init__(self, url: str, *, fetcher, offset_cap: int = OFFSET_CAP, max_limit: int = MAX_LIMIT):
        self.url = url
        self.root = portal_root(url)
        self.endpoint = f"{self.root}{API}/catalog/datasets"
        self.fetcher = fetcher
        self.offset_cap, self.max_limit = offset_cap, max_limit
        self.total: int | None = None
        self.listed = 0
        self.cut: str | None = None

    def __repr__(self) -> str:
        return f"OpenDataSoftSource({scrub_url(self.root)!r})"


    def _page(self, params: dict, filtered: bool) -> dict:
        url = self.endpoint

        def parse(resp):
            shown = f"{scrub_url(resp.url or url)}"
            if resp.status_code == 400 and filtered:
                raise FilterRejected(f"{scrub_url(self.root)}: the catalogue refused the modified-since filter "
                                     f"{params.get('where')!r} (HTTP 400 at {shown}): {resp.text[:200]}")
            if resp.status_code == 404:
                raise SourceError(f"{scrub_url(self.root)}: no OpenDataSoft Explore v2.1 catalogue at {shown} "
                                  f"(HTTP 404): is the portal's address right?")
            if not 200 <= resp.status_code < 300:
                raise SourceError(f"{scrub_url(self.root)}: GET {shown} answered HTTP {resp.status_code} "
                                  f"{resp.reason or ''}: {resp.text[:200]}".rstrip())
            try:
                body = answer_json(resp)  # (a page of any depth: sources/json_stream.py)
            except ValueError as exc:  # a cut body or a proxy's page: try again
                raise Retryable(f"{shown}: the answer is not JSON ({exc})") from exc
            if not isinstance(body, Mapping) or not isinstance(body.get("results", body.get("datasets")), list):
                raise SourceError(f"{scrub_url(self.root)}: GET {shown} answered JSON without a 'results' list: "
                                  f"not an Explore v2.1 catalogue")
            return body

        return self.fetcher.get(url, params=params, parse=parse,
                                what=f"{scrub_url(self.root)}: GET {scrub_url(url)}")

    def iter_items(self, since: datetime | None, page_size: int, listing: Listing | None = None,
                   select: str | None = None) -> Iterator[list]:
        """Pages of catalogue results (raw dataset objects), all of them or those modified at or
        after ``since`` (``select``: only those fields, if the portal obliges): paged while the
        first page's ``total_count`` is below the offset cap, the rest exported past it. Sets
        ``total``, and ``listing.complete`` when everything was listed, on proof (the module's
        docstring)."""
        listing = listing if listing is not None else Listing()
        listing.complete = False
        self.total, self.listed, self.cut = None, 0, None
        limit = max(1, min(int(page_size), self.max_limit))
        condition = modified_filter(since) if since is not None else None
        check = _Checked(self, condition, since_second(since) if since is not None else None)
        base = {"order_by": "dataset_id"}
        if condition:
            base["where"] = f"({condition})"
        if select:
            base["select"] = select
        offset = 0
        while True:
            size = min(limit, self.offset_cap - offset)
            body = self._page({**base, "limit": size, "offset": offset}, filtered=condition is not None)
            items = [unwrap(i) for i in body.get("results", body.get("datasets")) or []]
            told = body.get("total_count")
            told = told if isinstance(told, int) and not isinstance(told, bool) else None
            if self.total is None:
                self.total = told
                if told is not None and told >= self.offset_cap:
                    log.info("%s: %d datasets%s, at or past the %d the records endpoint pages through: "
                             "listed from the exports endpoint", scrub_url(self.root), told,
                             " changed" if condition else "", self.offset_cap)
                    page = check.fresh(items, offset)
                    if page is None:
                        return self._cut(since)
                    if page:
                        yield page
                    yield from self._exported(base, limit, check)
                    listing.complete = since is None
                    return
            if not items:
                break  # an empty page: the API has no more
            page = check.fresh(items, offset)
            if page is None:
                return self._cut(since)
            yield page
            offset += len(items)
            if len(items) < size and told is not None and offset >= told:
                break  # a short page that its own total_count says is the last one
            if offset >= self.offset_cap:
                # the catalogue grew past the window while it was paged: the rest through the export
                log.info("%s: more than %d datasets%s after all: the rest listed from the exports endpoint",
                         scrub_url(self.root), self.offset_cap, " changed" if condition else "")
                yield from self._exported(base, limit, check)
                break
        listing.complete = since is None

    def _exported(self, base: dict, page_size: int, check: "_Checked") -> Iterator[list]:
        """The export of ``base``'s selection in pages of ``page_size``, without the datasets
        already listed. Returns only once an export's array closed and its body ended cleanly; an
        export cut short is asked again (the fetcher's ``max_retries`` times) and then raises
        ``SourceUnavailable``."""
        url = f"{self.root}{EXPORT}"
        attempts = 1 + getattr(self.fetcher, "max_retries", 0)
        for attempt in range(1, attempts + 1):
            resp = self._export_response(url, base, filtered="where" in base)
            raw = resp.raw
            raw.decode_content = True  # a gzip / deflate Content-Encoding undone as the body streams
            page: list = []
            got = 0
            try:
                for item in _array_items(raw, scrub_url(resp.url or url)):
                    got += 1
                    page.append(unwrap(item))
                    if len(page) >= page_size:
                        fresh = check.fresh(page, None, exported=True)
                        page = []
                        if fresh:
                            yield fresh
                fresh = check.fresh(page, None, exported=True)
                if fresh:
                    yield fresh
                return
            except (ExportCut, Urllib3Error, OSError) as exc:
                why = str(exc) if isinstance(exc, ExportCut) else f"the connection broke ({failure_text(exc)})"
                last = f"{scrub_url(url)}: the export ended after {got} datasets, before its end: {why}"
                if attempt >= attempts:
                    raise RetriesExhausted(f"{scrub_url(self.root)}: {last}; asked {attempts} times, the listing is "
                                           f"incomplete ({self.listed} datasets)", attempts=attempts, last=last,
                                           status=resp.status_code) from exc
                log.warning("%s; asking for it again (%d of %d), the %d datasets listed so far skipped", last,
                            attempt, attempts - 1, self.listed)
            finally:
                self.fetcher.add_bytes(streamed_bytes(raw))
                resp.close()

    def _export_response(self, url: str, params: dict, filtered: bool):
        """The export's answer, its body unread (retried by the fetcher on 5xx and 429)."""

        def check(resp):
            shown = scrub_url(resp.url or url)
            if 200 <= resp.status_code < 300:
                return resp
            try:
                text = resp.text[:200]
            finally:
                resp.close()
            if resp.status_code == 400 and filtered:
                raise FilterRejected(f"{scrub_url(self.root)}: the catalogue export refused the modified-since "
                                     f"filter {params.get('where')!r} (HTTP 400 at {shown}): {text}")
            if resp.status_code == 404:
                raise SourceError(f"{scrub_url(self.root)}: no OpenDataSoft Explore v2.1 catalogue export at {shown} "
                                  f"(HTTP 404), though the catalogue lists more datasets than its records endpoint "
                                  f"pages through")
            raise SourceError(f"{scrub_url(self.root)}: GET {shown} answered HTTP {resp.status_code} "
                              f"{resp.reason or ''}: {text}".rstrip())

        return self.fetcher.get(url, params=params, stream=True, parse=check,
                                what=f"{scrub_url(self.root)}: GET {scrub_url(url)}")

    def _cut(self, since: datetime | None) -> None:
        """A listing that cannot go on ends with a warning, incomplete (``listing.complete`` stays
        False): after a full one the pipeline removes nothing (steps.fetch_modified)."""
        log.warning("%s", self.cut)

    def iter_records(self, since: datetime | None, page_size: int, listing: Listing,
                     validators: dict | None = None) -> Iterator[list[DatasetRecord]]:
        """The Source protocol (sources/base.py)."""
        for items in self.iter_items(since, page_size, listing):
            yield [normalize(item, self.root) for item in items]

    # -- reconciliation (sources/base.py) -----------------------------------------------------
    def list_ids(self, page_size: int) -> Iterator[IdPage]:
        """Every dataset_id with its ``default.modified``, asked narrowed to those two fields
        (``select=dataset_id,modified``); a portal that sends whole datasets anyway gets them used
        as records. A listing cut short raises ``ListingCut`` (it would remove what it missed)."""
        listing = Listing()
        for items in self.iter_items(None, page_size, listing, select=SELECT_IDS):
            page = IdPage(ids=[])
            for item in items:
                ident = dataset_id(item)
                if ident is None:
                    page.unusable += 1
                    continue
                modified = modified_of(item)
                page.ids.append((ident, to_ms(modified) if modified is not None else None))
                if isinstance(item.get("metas"), Mapping):
                    page.records.append(normalize(item, self.root))
            if page.records:
                page.ignored = f"select={SELECT_IDS}"
            yield page
        if not listing.complete:
            raise ListingCut(f"{self.cut}; an incomplete identifier listing cannot be reconciled with "
                             f"(it would remove what it did not reach)")

    def fetch_by_ids(self, ids: list[str], per_request: int = 100) -> Iterator[list[DatasetRecord]]:
        """The datasets of ``ids``, ``where dataset_id = "a" OR dataset_id = "b" ...`` a request of at
        most ``per_request`` (and 100) ids; ids the portal no longer shows are left out. A portal
        that answers other datasets ignored the condition: ``FilterRejected``."""
        size = max(1, min(int(per_request), self.max_limit))
        for start in range(0, len(ids), size):
            chunk = ids[start:start + size]
            where = " OR ".join(f"dataset_id = {_odsql_string(i)}" for i in chunk)
            body = self._page({"limit": len(chunk), "offset": 0, "order_by": "dataset_id", "where": where},
                              filtered=False)
            items = [unwrap(i) for i in body.get("results", body.get("datasets")) or []]
            wanted = set(chunk)
            strays = [dataset_id(i) for i in items if dataset_id(i) not in wanted]
            if strays:
                raise FilterRejected(f"{scrub_url(self.root)}: the catalogue ignored the condition on dataset_id "
                                     f"(asked for {len(chunk)} ids, answered {strays[:3]!r} among others)")
            yield [normalize(item, self.root) for item in items]

    def count(self) -> int | None:
        """The catalogue's ``total_count``, asked with ``limit=0``."""
        body = self._page({"limit": 0, "offset": 0}, filtered=False)
        total = body.get("total_count")
        return total if isinstance(total, int) and not isinstance(total, bool) else None


class _Checked:
    """What a listing has seen: the ids listed (each dataset once, whatever the pages and the
    export repeat), and the modified-since check (a dataset older than asked: the filter was
    ignored)."""

    def __init__(self, source: OpenDataSoftSource, condition: str | None, boundary: datetime | None):
        self.source, self.condition, self.boundary = source, condition, boundary
        self.seen: set[str] = set()

    def fresh(self, items: list, offset: int | None, exported: bool = False) -> list | None:
        """The datasets of ``items`` not listed before, counted in ``source.listed``; None (and
        ``source.cut`` set) for a page of the records endpoint that brings none (a loop)."""
        source = self.source
        ids = [dataset_id(i) for i in items]
        if items and not exported and not any(i is not None and i not in self.seen for i in ids):
            source.cut = (f"{scrub_url(source.root)}: the page at offset {offset} repeats datasets already listed: "
                          f"the listing stops there, incomplete ({source.listed} datasets)")
            return None
        if self.boundary is not None:
            for item in items:
                modified = modified_of(item) if isinstance(item, Mapping) else None
                if modified is not None and modified < self.boundary:
                    raise FilterRejected(
                        f"{scrub_url(source.root)}: the catalogue ignored the modified-since filter "
                        f"{self.condition!r}: dataset {dataset_id(item)!r} was modified {modified.isoformat()}, "
                        f"before {self.boundary.isoformat()}")
        page = []
        for item, ident in zip(items, ids):
            if ident is None or ident not in self.seen:  # (an id listed again: once)
                page.append(item)
                if ident is not None:
                    self.seen.add(ident)
        source.listed += len(page)
        return page


def _array_items(fp, where: str) -> Iterator[Any]:
    """The items of the JSON array that ``fp`` holds, one at a time, parsed as they stream
    (ijson), each as ``json.loads`` reads it: a bare NaN or ±Infinity, or a lone surrogate escape,
    which the parser refuses or alters, goes through as a stand-in (sources/json_stream.py) and
    is that dataset's to bear, as on a page of the records endpoint. An item is built with at most
    ``json_stream.KEPT_LEVELS`` levels (``build``: one nested deeper still fails as
    ``record-too-deep``, and no depth costs more than those levels). Raises ``ExportCut`` unless
    the array closes and the document ends there, and ``SourceError`` for a document that is not
    an array."""
    stand_ins = StandIns(fp)
    events = ijson.basic_parse(stand_ins, use_float=True)
    closed = False
    try:
        first = next(events, None)
        if first is None:
            raise ExportCut("the body is empty")
        if first[0] != "start_array":
            raise SourceError(f"{where}: the export is not a JSON array (it starts with {first[0]}): not an "
                              f"Explore v2.1 catalogue export")
        for event, value in events:
            if event == "end_array":
                closed = True
                continue  # (what follows the array, if anything, is the parser's error)
            if event == "start_map" or event == "start_array":
                value = build(events, event, stand_ins=stand_ins)
            yield stand_ins.restore(value) if stand_ins.pending else value
    except ijson.IncompleteJSONError as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ExportCut(f"not a whole JSON document ({reason[:120]})") from exc
    except ijson.JSONError as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise SourceError(f"{where}: the export is not valid JSON ({reason[:200]})") from exc
    if not closed:
        raise ExportCut("its JSON array never closed")
