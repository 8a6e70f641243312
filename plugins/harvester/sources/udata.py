"""udata portals (data.gouv.fr, data.public.lu...) through udata's REST API v1: ``type: udata``.

The portal url names the scope:

- a site: ``https://www.data.gouv.fr`` (also ``.../fr/``, ``.../api/1/`` or ``.../api/1/datasets/``):
  every dataset of ``/api/1/datasets/``;
- an organisation: its page, ``https://www.data.gouv.fr/fr/organizations/<slug or id>/`` (with or
  without the language segment), its API URL ``.../api/1/organizations/<slug or id>/``, or
  ``.../api/1/datasets/?organization=<id>``: the same listing filtered with ``organization=<id>``. A
  slug is resolved to the id once (``GET /api/1/organizations/<slug>/``: the filter takes an id
  only, udata answers 400 "Organization arg must be an identifier" to a slug). The organisation's
  own ``/api/1/organizations/<id>/datasets/`` is not used: it lists the organisation's deleted and
  archived datasets too and takes no filter (udata ``OrgDatasetsAPI``; a bare list in 2017).
- a saved answer (a ``file://`` or uploaded document, as ``harvester validate`` reads one): a Page
  (``{data, next_page, ...}``), a list of datasets or one dataset, read as it is.

Any other url is refused when the source is made, the message naming it and the forms above.

Pages are udata's Page envelope ``{data, page, page_size, total, next_page, previous_page}``
(``next_page`` an absolute URL, null on the last page), ``page`` and ``page_size`` positive
integers with no upper bound in udata's code (``add_pagination_arguments``); we ask at most
``MAX_PAGE_SIZE`` whole datasets a page (one dataset can be 200 KB: 129 resources) and
``MAX_ID_PAGE_SIZE`` in an id listing. ``sort`` must be one of udata's (``title``, ``created``,
``last_update``, ``reuses``, ``followers``, ``views``, ``-`` for descending): anything else is a 400.
The listing is MongoDB ``skip``/``limit`` paging, and a page past the last one is a 404.

Incremental (``since``): ``sort=-last_update``, newest first, stopping at the first dataset whose
sort date is older than ``since`` (``Listing.reached_since``). The sort date is ``last_update``
(udata >= 2025-07, #3377); before, the same ``-last_update`` sorted by the internal modification
date (``internal.last_modified_internal``, shown since 2023). The listing takes whichever of the two
the first pages are in order by, and a portal whose pages are in order by neither ignored the sort:
``FilterRejected`` (the pipeline lists everything instead), as is a 400 to the sort.
``metadata_modified`` is ``last_modified`` (the metadata's): an edit of the metadata alone changes
it and not ``last_update``, so the incremental does not see it; the reconciliation (which compares
``last_modified``) does. A dataset data.gouv.fr harvests from elsewhere carries the remote dates
(``harvest.modified_at``) as ``last_update``, which may be older than the watermark when it arrives:
a reconciliation (``reconcile_every``, or the count check) finds those.

A full listing (``since`` None) and ``list_ids`` sort by ``created`` (ascending): a dataset created
or edited while the pages are read does not move the ones not read yet (with ``-last_update`` an
edit moves a dataset from an unread page to the first one, and the listing misses it). A listing is
complete only when ``next_page`` is null, ``total`` did not change from the first page to the last,
and as many distinct datasets were listed as ``total`` says (a deletion while reading shifts the
pages and skips one; the counts tell). Otherwise nothing is removed on it (``list_ids`` raises
``SourceError``). ``next_page`` is followed only when it is of the portal's host and the listing's
path, asks the page after the one read and keeps the listing's ``sort``, ``organization`` and ``page_size``; it is
requested from the portal's own origin (an http:// ``next_page`` behind a TLS proxy is asked over
the portal's https). A page of datasets already listed, a next page that does not advance, or one
elsewhere ends the listing with a warning, not complete; a 404 for a next page (the catalogue
shrank while it was read) too.

Datasets that are deleted, private or archived are not listed by udata to anonymous users; with an
API key (``X-API-KEY``) a member or an administrator sees them too. Any such dataset that comes back
is left out (as if not listed), and ``fetch_by_ids`` leaves out those answered 404 / 410 (deleted).

``list_ids`` asks udata for the ids alone with a flask-restx field mask, the ``X-Fields`` header
(``data{id,last_modified,...},total,next_page,...``); a server that ignores it sends whole datasets,
which come as records. ``count`` is ``total`` of a one-dataset page. ``fetch_by_ids`` is one
``GET /api/1/datasets/<id>/`` an id.

Each dataset becomes a CKAN-shaped package: ``title``, ``description`` (Markdown) as notes,
``tags``, the organisation (else the owner), ``license``, ``created_at``, ``last_modified``, the
resources as distributions (url, else the stable ``latest``; title, format, mime, filesize,
checksum, type, last_modified...; the link checker's ``check:*`` / ``analysis:*`` extras left out),
``page`` as landing page (else ``uri``), and every other field as an extra (``frequency``,
``temporal_coverage``, ``spatial``, ``acronym``, ``slug``, ``badges``, ``harvest``, the dataset's own
``extras``), except what changes without the dataset changing: ``metrics``, ``quality``,
``internal``, ``permissions``, ``last_update``, ``frequency_date``, ``description_short``,
``recommendations*`` extras, the harvest's ``last_update``. Dates without a zone (2017-2019) are
UTC. A record without an id, title, or with an unreadable ``last_modified`` is that record's
failure (BadRecord), not the run's.
"""
from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator, Mapping
from datetime import datetime
from typing import Any
from urllib.parse import parse_qs, quote, urlencode, urlsplit, urlunsplit

from harvester.config.portals import UDATA
from harvester.domain.dataset import (DatasetRecord, clean_text, failed, normalize_url, package_record,
                                      parse_timestamp, screened_as_published, sha256_hex, slug)
from harvester.domain.outcomes import problem
from harvester.http import Retryable, origin_of, scrub_url
from harvester.sources.base import (EXACT_COUNT, BadRecord, Capabilities, CountsTraffic, FilterRejected, IdPage,
                                    Listing, SourceError, SourceUnavailable, coded, to_ms)
from harvester.sources.json_stream import loads

log = logging.getLogger(__name__)

KIND = UDATA
API = "/api/1"
INCREMENTAL_SORT = "-last_update"
FULL_SORT = "created"
MAX_PAGE_SIZE = 100       # whole datasets a page (udata has no cap; one dataset may be 200 KB)
MAX_ID_PAGE_SIZE = 1000   # datasets a page of an id listing (a few fields each, X-Fields)
ID_FIELDS = "id,last_modified,deleted,private,archived"
ID_MASK = f"data{{{ID_FIELDS}}},page,page_size,total,next_page"
COUNT_MASK = "total"
_OBJECT_ID = re.compile(r"^[0-9a-fA-F]{24}$")
_LANGUAGE = re.compile(r"^[a-z]{2}(?:-[a-z]{2})?$", re.I)
# The dates a page may be in order by for -last_update: udata's own (>= 2025-07), then the internal
# modification date that sort used before (udata #3377).
SORT_KEYS = (("last_update",), ("internal", "last_modified_internal"))

_MAPPED = frozenset({"id", "title", "description", "tags", "organization", "owner", "license", "created_at",
                     "last_modified", "resources", "extras", "page", "uri"})
# Fields that change without the dataset changing (views, the link checker, derived scores) or say
# who asks (permissions): kept out of the extras, so the metadata hash does not see them.
_VOLATILE = frozenset({"metrics", "quality", "internal", "permissions", "last_update", "frequency_date",
                       "description_short", "deleted", "private", "archived"})
_VOLATILE_EXTRA_PREFIXES = ("check:", "analysis:", "recommendations", "harvest:last_update")
_RESOURCE_VOLATILE = frozenset({"metrics", "internal", "preview_url"})


class InvalidPortalUrl(SourceError, ValueError):
    """A portal url that names no udata scope (site, organisation, saved answer)."""


class InvalidAnswer(SourceError, ValueError):
    """udata answered something that is not a Page of datasets."""


# -- the scope -------------------------------------------------------------------------------------
FORMS = ("the site (https://www.data.gouv.fr), an organisation's page "
         "(https://www.data.gouv.fr/fr/organizations/<slug or id>/) or "
         "https://www.data.gouv.fr/api/1/datasets/?organization=<id>")


def scope_of(url: str) -> tuple[str, str | None, bool]:
    """(the API root ``<origin><prefix>/api/1``, the organisation's id or slug or None, whether the
    url is a saved answer to read as it is) of a portal url; InvalidPortalUrl otherwise."""
    parts = urlsplit(url.strip())
    scheme = parts.scheme.lower()
    if scheme in ("file", "upload") or parts.path.lower().endswith(".json"):
        return url, None, True
    if scheme not in ("http", "https") or not parts.hostname:
        raise InvalidPortalUrl(f"{scrub_url(url)} is not a udata portal's url: give {FORMS}")
    query = parse_qs(parts.query)
    org = (query.get("organization") or [None])[-1]
    path = parts.path
    if "/api/1" in path:
        prefix, _, rest = path.partition("/api/1")
        segments = [s for s in rest.split("/") if s]
    else:
        prefix, segments = "", [s for s in path.split("/") if s]
        if segments and _LANGUAGE.match(segments[0]):
            segments = segments[1:]
    if segments in ([], ["datasets"]):
        pass
    elif len(segments) in (2, 3) and segments[0] == "organizations" and segments[2:] in ([], ["datasets"]):
        org = segments[1]
    else:
        raise InvalidPortalUrl(f"{scrub_url(url)} is not a udata portal's url: give {FORMS}")
    if org is not None and not org.strip():
        raise InvalidPortalUrl(f"{scrub_url(url)}: organization= is empty: give {FORMS}")
    root = urlunsplit((parts.scheme, parts.netloc, prefix.rstrip("/") + API, "", ""))
    return root, org.strip() if org else None, False


# -- mapping ---------------------------------------------------------------------------------------
def _text(value: Any) -> str | None:
    return value.strip() if isinstance(value, str) and value.strip() else None


def _as_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, ensure_ascii=False,
                                                           separators=(",", ":"))


def dataset_id(dataset: Any) -> str | None:
    return _text(dataset.get("id")) if isinstance(dataset, Mapping) else None


def _http(value: Any) -> str | None:
    text = _text(value)
    return text if text and text.lower().startswith(("http://", "https://")) else None


def _hidden(dataset: Mapping) -> str | None:
    """Why udata would not list ``dataset`` to anyone (deleted, private, archived), else None."""
    if dataset.get("deleted"):
        return "deleted"
    if dataset.get("private") is True:
        return "private"
    if dataset.get("archived"):
        return "archived"
    return None


def _resource(res: Mapping) -> dict:
    checksum = res.get("checksum") if isinstance(res.get("checksum"), Mapping) else {}
    extras = res.get("extras") if isinstance(res.get("extras"), Mapping) else {}
    out = {
        "id": res.get("id"),
        "url": _text(res.get("url")) or _text(res.get("latest")) or "",
        "name": _text(res.get("title")) or "",
        "description": res.get("description") if isinstance(res.get("description"), str) else None,
        "format": _text(res.get("format")) or "",
        "mimetype": res.get("mime"),
        "size": res.get("filesize"),
        "hash": (f"{checksum['type']}:{checksum['value']}" if _text(checksum.get("type"))
                 and _text(checksum.get("value")) else None),
        "created": res.get("created_at"),
        "last_modified": res.get("last_modified"),
        "resource_type": res.get("type"),
    }
    for key, value in res.items():
        if key in ("id", "url", "title", "description", "format", "mime", "filesize", "checksum", "created_at",
                   "last_modified", "type", "extras") or key in _RESOURCE_VOLATILE:
            continue
        if value not in (None, [], {}, ""):
            out[key] = value
    kept = {k: v for k, v in extras.items() if not str(k).startswith(_VOLATILE_EXTRA_PREFIXES)}
    if kept:
        out["extras"] = kept
    return {k: v for k, v in out.items() if v is not None}


def _organization(dataset: Mapping) -> dict | None:
    org = dataset.get("organization")
    if isinstance(org, Mapping) and _text(org.get("name")):
        return {"title": org["name"].strip(), "name": _text(org.get("slug")) or slug(org["name"]),
                "id": org.get("id")}
    owner = dataset.get("owner")
    if isinstance(owner, Mapping):
        name = " ".join(p for p in (_text(owner.get("first_name")), _text(owner.get("last_name"))) if p)
        name = name or _text(owner.get("slug"))
        if name:
            return {"title": name, "name": _text(owner.get("slug")) or slug(name), "id": owner.get("id")}
    return None


def to_package(dataset: Mapping, api_root: str) -> dict:
    """A udata dataset as a CKAN-shaped package (see the module's docstring). Raises ``BadRecord``
    naming the dataset when it has no id, no title, or an unreadable ``last_modified``."""
    ident = dataset_id(dataset)
    if ident is None:
        raise BadRecord("no-identifier", f"dataset {str(dataset.get('title'))[:80]!r} has no id", "id",
                        dataset.get("id"))
    title = _text(dataset.get("title"))
    if title is None:
        raise BadRecord("no-title", f"dataset {ident}: no title", "title", dataset.get("title"))
    modified = dataset.get("last_modified")
    if modified not in (None, "") and parse_timestamp(modified) is None:
        raise BadRecord("bad-date", f"dataset {ident}: last_modified {str(modified)[:60]!r} is not a date",
                        "last_modified", modified)
    description = dataset.get("description")
    if description is not None and not isinstance(description, str):
        raise BadRecord("wrong-type", f"dataset {ident}: its description is a {type(description).__name__}, "
                        "not a text", "description", description)
    tags = dataset.get("tags") if isinstance(dataset.get("tags"), list) else []
    resources = dataset.get("resources") if isinstance(dataset.get("resources"), list) else []
    extras: list[dict] = []
    taken: set[str] = set()
    for key, value in dataset.items():
        if key in _MAPPED or key in _VOLATILE or value in (None, [], {}, ""):
            continue
        if key == "harvest" and isinstance(value, Mapping):
            value = {k: v for k, v in value.items() if k != "last_update" and v is not None}
            if not value:
                continue
        extras.append({"key": key, "value": _as_text(value)})
        taken.add(key)
    own = dataset.get("extras") if isinstance(dataset.get("extras"), Mapping) else {}
    for key, value in own.items():
        if str(key).startswith(_VOLATILE_EXTRA_PREFIXES) or value in (None, [], {}, ""):
            continue
        extras.append({"key": f"extras:{key}" if key in taken else str(key), "value": _as_text(value)})
    landing = _http(dataset.get("page")) or _http(dataset.get("uri")) or f"{api_root}/datasets/{quote(ident)}/"
    return {
        "id": ident,
        "name": _text(dataset.get("slug")) or ident,
        "title": title,
        "notes": description,
        "tags": [{"name": t.strip()} for t in dict.fromkeys(t for t in tags if isinstance(t, str) and t.strip())],
        "organization": _organization(dataset),
        "license_id": _text(dataset.get("license")),
        "metadata_created": dataset.get("created_at"),
        "metadata_modified": modified if modified not in (None, "") else None,
        "url": landing,
        "resources": [_resource(r) for r in resources if isinstance(r, Mapping)],
        "extras": extras,
    }


@screened_as_published(dataset_id)
def normalize(dataset: Any, api_root: str) -> DatasetRecord:
    """A udata dataset as a DatasetRecord; an unusable one comes back failed, saying why (one too deep
    or too large fails before the mapping, a NaN is null before it: ``screened_as_published``)."""
    if not isinstance(dataset, Mapping):
        return failed(None, dataset, [problem("not-an-object", f"dataset is a {type(dataset).__name__}, "
                                                               "not a JSON object")])
    try:
        pkg = to_package(dataset, api_root)
    except ValueError as exc:
        return failed(dataset_id(dataset), dataset, coded(exc), prefix=f"{scrub_url(api_root)}: ")
    title, description = clean_text(pkg["title"]), clean_text(pkg["notes"])
    org = pkg["organization"]
    return package_record(pkg, source_id=pkg["id"], name=pkg["name"], url=pkg["url"],
                          url_hash=sha256_hex(normalize_url(pkg["url"])), title=title, description=description,
                          tags=sorted({t["name"] for t in pkg["tags"]}), organization=org["title"] if org else None,
                          notes_text=description)


def sort_date(dataset: Any, key: tuple[str, ...]) -> datetime | None:
    value: Any = dataset
    for part in key:
        value = value.get(part) if isinstance(value, Mapping) else None
    return parse_timestamp(value)


# -- over HTTP -------------------------------------------------------------------------------------
def _with_params(url: str, params: Mapping[str, Any]) -> str:
    parts = urlsplit(url)
    query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
    query.update({k: str(v) for k, v in params.items()})
    return urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(query), ""))


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class _Gone(Exception):
    """A followed next page answered 404: the catalogue shrank while it was read."""


class UdataSource(CountsTraffic):
    """A udata portal's datasets (site or organisation) through the API v1, GETs through ``fetcher``
    (harvester.http.HttpFetcher). ``portal``: the Portal (its name in messages). After a listing:
    ``total`` (the Page's), ``cut`` (the listing stopped on a loop or an inconsistency)."""

    kind = KIND
    capabilities = Capabilities(incremental=True, reconcile=True, count=EXACT_COUNT)  # as sources/__init__.py
    max_pages = 1_000_000

    def __init__(self, url: str, *, fetcher, portal=None):
        self.url = url
        self.api, self.org_ref, self.document = scope_of(url)
        self.fetcher = fetcher
        name = getattr(portal, "name", portal)
        self.portal = name or scrub_url(url)
        self.total: int | None = None
        self.cut = self.changed = False
        self._org_id: str | None = self.org_ref if self.org_ref and _OBJECT_ID.match(self.org_ref) else None
        self.list_url = url if self.document else f"{self.api}/datasets/"
        self._origin = origin_of(self.api)

    def __repr__(self) -> str:
        scope = f", organization={self.org_ref!r}" if self.org_ref else ""
        return f"UdataSource({scrub_url(self.list_url)!r}{scope})"

    # -- requests ------------------------------------------------------------------------------------
    def _get_json(self, url: str, params: dict | None = None, headers: dict | None = None, *,
                  sort: str | None = None, followed: bool = False, gone_ok: bool = False) -> Any:
        shown = scrub_url(url) + (f"?{urlencode(params)}" if params else "")
        where = f"portal {self.portal}: GET {shown}"

        def parse(resp):
            status = resp.status_code
            if status == 200:
                try:
                    return loads(resp.content)  # (an answer of any depth: sources/json_stream.py)
                except ValueError as exc:  # a cut body or a proxy's page: try again
                    raise Retryable(f"the answer is not JSON ({len(resp.content)} bytes: {resp.text[:60]!r})") from exc
            message = _message(resp)
            if status in (404, 410) and gone_ok:
                return _Gone
            if status == 404 and followed:
                raise _Gone()
            if status == 400 and sort is not None and "sort" in message.lower():
                raise FilterRejected(f"{where}: the portal refused sort={sort} (HTTP 400: {message})")
            if status in (401, 403):
                raise SourceError(f"{where}: HTTP {status} ({message}): the API key (X-API-KEY, the portal's "
                                  "conn_id) is missing, wrong or revoked")
            if status == 404:
                raise SourceError(f"{where}: HTTP 404 ({message}): no udata API v1 at this url (is the portal's "
                                  f"url a udata site or organisation? give {FORMS})")
            raise SourceError(f"{where}: HTTP {status} {resp.reason or ''}".rstrip() + (f" ({message})" if message
                                                                                          else ""))

        return self.fetcher.get(url, params=params, headers=headers, parse=parse, what=where)

    def organization_id(self) -> str | None:
        """The organisation's id (its slug resolved once); None for a site."""
        if self.org_ref is None or self._org_id is not None:
            return self._org_id
        url = f"{self.api}/organizations/{quote(self.org_ref, safe='')}/"
        body = self._get_json(url, headers={"X-Fields": "id,slug,name"})
        ident = dataset_id(body)
        if ident is None or not _OBJECT_ID.match(ident):
            raise InvalidAnswer(f"portal {self.portal}: GET {scrub_url(url)} did not answer an organisation with "
                                f"an id ({str(body)[:80]!r})")
        self._org_id = ident
        return ident

    def _first_params(self, sort: str | None, page_size: int) -> dict:
        params: dict[str, Any] = {}
        org = self.organization_id()
        if org:
            params["organization"] = org
        if sort:
            params["sort"] = sort
        params.update(page=1, page_size=page_size)
        return params

    def _next_url(self, link: Any, page: int, params: dict) -> str | None:
        """``next_page`` as the URL to ask (on the portal's own origin), or None (with a warning)
        when it is not the page after ``page`` of this listing on this portal."""
        if not isinstance(link, str) or not link.strip():
            log.warning("portal %s: next_page %r is not a URL; the listing stops there (not complete)", self.portal,
                        str(link)[:80])
            return None
        parts = urlsplit(link.strip())
        query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
        ours = urlsplit(self.list_url)
        problems = []
        if (parts.hostname or "").lower().rstrip(".") != self._origin[1]:
            problems.append(f"it is on another host ({parts.hostname})")
        if parts.path.rstrip("/") != ours.path.rstrip("/"):
            problems.append(f"it is another path ({parts.path})")
        try:
            asked = int(query.get("page", ""))
        except ValueError:
            asked = None
        if asked != page + 1:
            problems.append(f"it asks page {query.get('page')!r} after page {page}")
        for key in ("sort", "organization", "page_size"):
            if key in params and query.get(key) != str(params[key]):
                problems.append(f"it drops {key}={params[key]}")
        if problems:
            log.warning("portal %s: next_page %s is not the page after page %d of this listing (%s); the listing "
                        "stops there and is not complete (nothing is removed on it)", self.portal,
                        scrub_url(link), page, "; ".join(problems))
            return None
        return urlunsplit((ours.scheme, ours.netloc, parts.path, parts.query, ""))

    def _pages(self, sort: str | None, page_size: int, headers: dict | None, listing: Listing | None):
        """(page number, data list) of every page of the listing sorted by ``sort``, following
        ``next_page``; sets ``total`` and ``cut``, and ``listing.complete`` on proof (see the
        module's docstring). A saved answer is read as it is."""
        self.total, self.cut, self.changed = None, False, False
        if self.document:
            yield from self._document_pages(listing)
            return
        params = self._first_params(sort, page_size)
        url, query = self.list_url, params
        first_total: int | None = None
        seen: set[str] = set()
        received = 0
        page_no = 1
        for n in range(self.max_pages):
            try:
                # (a 400 to the incremental's sort is FilterRejected; to the full listing's, an error)
                body = self._get_json(url, query, headers, sort=sort if sort == INCREMENTAL_SORT else None,
                                      followed=n > 0)
            except _Gone:
                log.warning("portal %s: page %d answered 404: the catalogue shrank while it was read; the listing "
                            "stops there and is not complete (nothing is removed on it)", self.portal, page_no)
                self.cut = True
                return
            if not isinstance(body, Mapping) or not isinstance(body.get("data"), list):
                raise InvalidAnswer(f"portal {self.portal}: GET {scrub_url(url)}: not a udata Page (no 'data' list: "
                                    f"{str(body)[:80]!r})")
            total = _int(body.get("total"))
            if total is not None:
                self.total = total
                first_total = total if first_total is None else first_total
            data = body["data"]
            ids = [dataset_id(d) for d in data]
            fresh = [i for i in ids if i is not None and i not in seen]
            if data and not fresh and any(i is not None for i in ids):
                log.warning("portal %s: page %d repeats datasets already listed; the listing stops there and is "
                            "not complete (nothing is removed on it)", self.portal, page_no)
                self.cut = True
                return
            received += len(fresh) + sum(i is None for i in ids)
            seen.update(fresh)
            yield page_no, [d for d, i in zip(data, ids) if i is None or i in fresh]
            link = body.get("next_page")
            if link is None:
                if listing is not None:
                    listing.complete = self._whole(first_total, total, received)
                return
            if not data:
                log.warning("portal %s: page %d is empty but names a next page; the listing stops there (not "
                            "complete)", self.portal, page_no)
                self.cut = True
                return
            nxt = self._next_url(link, page_no, params)
            if nxt is None:
                self.cut = True
                return
            url, query, page_no = nxt, None, page_no + 1
        log.warning("portal %s: more than %d pages; the listing stops there (not complete)", self.portal,
                    self.max_pages)
        self.cut = True

    def _whole(self, first_total: int | None, total: int | None, received: int) -> bool:
        """Whether a listing that reached ``next_page: null`` is the whole catalogue: as many distinct
        datasets as the last ``total`` says, and no dataset went away meanwhile (``total`` fell: the
        pages after it moved up one place, and one was skipped). A dataset created meanwhile is
        appended to a listing in creation order and harms nothing. ``changed``: it failed on that."""
        self.changed = False
        if first_total is not None and total is not None and total < first_total:
            log.warning("portal %s: total went from %d to %d while the pages were read (datasets deleted meanwhile): "
                        "the listing may have skipped some, so nothing is removed on it", self.portal,
                        first_total, total)
            self.changed = True
            return False
        if total is not None and received != total:
            log.warning("portal %s: %d distinct datasets listed where total says %d (the catalogue changed while it "
                        "was read): nothing is removed on this listing", self.portal, received, total)
            self.changed = True
            return False
        return True

    def _document_pages(self, listing: Listing | None):
        body = self._get_json(self.list_url)
        if isinstance(body, list):
            data, complete = body, True
        elif isinstance(body, Mapping) and isinstance(body.get("data"), list):
            data, complete = body["data"], body.get("next_page") is None
            self.total = _int(body.get("total"))
        elif isinstance(body, Mapping) and ("id" in body or "title" in body):
            data, complete = [body], True
        else:
            raise InvalidAnswer(f"portal {self.portal}: {scrub_url(self.list_url)} is neither a udata Page, a list "
                                "of datasets nor a dataset")
        yield 1, data
        if listing is not None and complete:
            listing.complete = True

    # -- the protocol --------------------------------------------------------------------------------
    def iter_records(self, since: datetime | None, page_size: int, listing: Listing,
                     validators: dict | None = None) -> Iterator[list[DatasetRecord]]:
        """Pages of records: every dataset (``listing.complete`` on proof), or, newest first by
        ``last_update``, those updated since ``since`` (``listing.reached_since`` once an older
        one came). See the module's docstring."""
        size = max(1, min(page_size, MAX_PAGE_SIZE))
        if since is None or self.document:
            for _, data in self._pages(None if self.document else FULL_SORT, size, None, listing):
                page = [normalize(d, self.api) for d in data if not (isinstance(d, Mapping) and _hidden(d))]
                if page:
                    yield page
            return
        listing.complete = False
        since_ms = to_ms(since)
        keys = list(SORT_KEYS)        # the dates the pages are still in order by
        previous: dict[tuple, datetime] = {}
        for page_no, data in self._pages(INCREMENTAL_SORT, size, None, None):
            for d in data:
                for key in list(keys):
                    when = sort_date(d, key)
                    if when is None:
                        continue
                    if key in previous and to_ms(when) > to_ms(previous[key]):
                        keys.remove(key)
                    else:
                        previous[key] = when
                if not keys:
                    raise FilterRejected(
                        f"portal {self.portal}: {scrub_url(self.list_url)} ignored sort={INCREMENTAL_SORT}: dataset "
                        f"{dataset_id(d)} on page {page_no} is newer than one before it; it cannot be listed by "
                        "update time")
            stop_at = None
            for i, d in enumerate(data):
                # older than since by every date the pages are still in order by (while both are, the
                # later one decides: reading a few more never misses one)
                dates = [sort_date(d, key) for key in keys]
                if all(when is None or to_ms(when) < since_ms for when in dates):
                    stop_at = i
                    break
            kept = data if stop_at is None else data[:stop_at]
            page = [normalize(d, self.api) for d in kept if not (isinstance(d, Mapping) and _hidden(d))]
            if page:
                yield page
            if stop_at is not None:
                log.info("portal %s: reached datasets not updated since %s (%s) on page %d", self.portal,
                         since.isoformat(), " / ".join(".".join(key) for key in keys), page_no)
                listing.reached_since = True
                return

    def count(self) -> int | None:
        """``total`` of a one-dataset page: one request."""
        body = self._get_json(self.list_url, self._first_params(None, 1), {"X-Fields": COUNT_MASK})
        return _int(body.get("total")) if isinstance(body, Mapping) else None

    def list_ids(self, page_size: int) -> Iterator[IdPage]:
        """Every dataset's id and ``last_modified``, with the ``X-Fields`` mask; whole datasets (a
        server ignoring the mask) come as records. A listing not proved complete raises SourceError
        after its last page: a partial one would make what it missed look removed."""
        listing = Listing()
        size = max(1, min(page_size, MAX_ID_PAGE_SIZE))
        for _, data in self._pages(FULL_SORT, size, {"X-Fields": ID_MASK}, listing):
            ids, unusable, whole = [], 0, []
            for d in data:
                ident = dataset_id(d)
                if ident is None:
                    unusable += 1
                    continue
                if _hidden(d):
                    continue
                modified = parse_timestamp(d.get("last_modified"))
                ids.append((ident, to_ms(modified) if modified else None))
                if set(d) - set(ID_FIELDS.split(",")):
                    whole.append(d)
            yield IdPage(ids, unusable, [normalize(d, self.api) for d in whole],
                         "the X-Fields mask" if whole else "")
        if not listing.complete:
            error = SourceUnavailable if self.changed else SourceError  # (a catalogue edited meanwhile: try again)
            raise error(f"portal {self.portal}: the identifier listing of {scrub_url(self.list_url)} could not be "
                        "read whole (see the warning above); no reconciliation on a partial listing")

    def fetch_by_ids(self, ids: list[str], per_request: int = 100) -> Iterator[list[DatasetRecord]]:
        """The datasets of ``ids``, one ``GET /api/1/datasets/<id>/`` each, ``per_request`` a page;
        those answered 404 or 410 (deleted), or now private, deleted or archived, are left out."""
        page: list[DatasetRecord] = []
        for ident in dict.fromkeys(i for i in ids if i):
            body = self._get_json(f"{self.api}/datasets/{quote(ident, safe='')}/", gone_ok=True)
            if body is _Gone or (isinstance(body, Mapping) and _hidden(body)):
                continue
            if isinstance(body, Mapping) and dataset_id(body) not in (None, ident):
                continue  # (asked by id: another dataset's answer is not this one)
            page.append(normalize(body, self.api))
            if len(page) >= max(1, per_request):
                yield page
                page = []
        if page:
            yield page


def _message(resp) -> str:
    """udata's error ``message`` (and flask-restx's ``errors``), else the body's start."""
    try:
        body = loads(resp.content)
    except ValueError:
        return resp.text[:120].strip()
    if isinstance(body, Mapping):
        parts = [str(body["message"])] if body.get("message") else []
        if isinstance(body.get("errors"), Mapping):
            parts += [f"{k}: {v}" for k, v in body["errors"].items()]
        return "; ".join(parts)[:300]
    return str(body)[:120]
