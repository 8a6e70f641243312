"""ArcGIS Hub sites as a source, through the Hub's OGC API Records search: ``type: arcgis-hub``.

The portal's url is a Hub site (``https://data-city.hub.arcgis.com``) or its items endpoint itself
(``.../api/search/v1/collections/dataset/items``). Pages are ``GET items?limit=N&startindex=S``
(``startindex`` counts from 1), GeoJSON FeatureCollections with ``numberMatched`` (the ``total``),
``numberReturned`` and a ``links`` entry ``rel: next`` while there is more; the next link is
followed when there is one, else ``startindex`` moves on by what the page returned. The end (a
complete listing) is an empty page, or no next link once ``numberMatched`` (exact) is reached; a page
shorter than ``limit`` is not (a server may cap its pages below it).

Incremental listings send the Hub's CQL filter on the item's ``modified`` date (epoch ms), in the
form Hub sites are queried with (``filter=((modified BETWEEN <since ms> AND <far future ms>))``).
A server that answers a filtered listing with a record modified before ``since`` ignored the filter:
``FilterRejected`` (the pipeline falls back to a full listing); a 400 to it refused the filter.

Paging cannot loop: a next link already followed, a page of exactly the items of an earlier page, or
a next page that does not move forward ends the listing with a warning, and the listing is then not
complete (``listing.complete`` False), so the pipeline removes nothing (steps.fetch_modified).

Reconciliation: ``count`` is one ``limit=0`` search (``numberMatched``), ``list_ids`` pages the
search with ``fields=id,modified`` (a server that ignores ``fields`` sends whole features, which
come as records), ``fetch_by_ids`` asks ``filter=((id IN (a, b)))``. An id listing whose paging
loops raises ``SourceError`` rather than pass for the whole portal. Page size is at most 100.

The Hub's DCAT-US feed (``/api/feed/dcat-us/1.1.json``) is not used: it reads through the
``dcat-json`` kind, but (in the real feed in tests/data/arcgis-hub) carries HTML disclaimers as
``license``, which that source refuses, and cannot be filtered by date.

Each feature's ``properties`` (an ArcGIS item) becomes a CKAN-shaped package: ``title``,
``description`` (else ``snippet``), ``tags``, ``categories`` as groups, the organisation
(``orgName``, else ``source``, else ``owner``), the licence (``license``, else ``licenseInfo``, HTML
cleaned), ``created``/``modified`` (epoch ms, UTC), the item's ``url`` (its service) as a resource
with the item ``type`` as format, the Hub dataset page ``<site>/datasets/<id>`` as landing page, and
every other property as an extra (``modified`` aside: it is ``metadata_modified``).
"""
from __future__ import annotations

import logging
import re
from datetime import datetime, timezone
from typing import Any, Iterator, Mapping
from urllib.parse import parse_qs, urlencode, urlsplit, urlunsplit

from harvester.config.portals import ARCGIS_HUB
from harvester.domain.dataset import (DatasetRecord, clean_text, failed, normalize_url, package_record,
                                      parse_timestamp, screened_as_published, sha256_hex, text_list)
from harvester.domain.outcomes import problem
from harvester.http import Retryable, scrub_url
from harvester.sources.base import (BadRecord, Capabilities, CountsTraffic, FilterRejected, IdPage, Listing,
                                    SourceError, coded, to_ms)
from harvester.sources.json_stream import loads

log = logging.getLogger(__name__)

KIND = ARCGIS_HUB
ITEMS_PATH = "/api/search/v1/collections/dataset/items"
LIST_FIELDS = "id,modified"
MAX_LIMIT = 100  # the most items a Hub search page holds
FAR_FUTURE_MS = 253402300799000  # 9999-12-31T23:59:59Z: the open end of the modified range
MAX_LICENSE_CHARS = 500
_MAPPED = frozenset({"id", "title", "name", "description", "snippet", "tags", "categories", "orgName", "source",
                     "owner", "license", "licenseInfo", "created", "modified", "url", "type"})


def items_url(url: str) -> str:
    """The OGC API Records items endpoint of a Hub site (the url itself when it is one)."""
    if "/api/search/v1/collections/" in url:
        return url
    return url.rstrip("/") + ITEMS_PATH


def site_url(url: str) -> str:
    """The Hub site an items endpoint belongs to (where its dataset pages are)."""
    return url.split("/api/search/v1/", 1)[0].rstrip("/")


def epoch_ms(dt: datetime) -> int:
    dt = dt.replace(tzinfo=timezone.utc) if dt.tzinfo is None else dt.astimezone(timezone.utc)
    return int(dt.timestamp() * 1000)


def iso_from_ms(value: Any) -> str | None:
    """An epoch-milliseconds date as ISO 8601 UTC; None when missing, not a number, or past any
    calendar (1e300: the platform's clock refuses it with OverflowError, ValueError or OSError)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        return datetime.fromtimestamp(value / 1000, tz=timezone.utc).isoformat()
    except (OverflowError, ValueError, OSError):
        return None


def _past_any_calendar(value: Any) -> bool:
    """A number of epoch milliseconds no date holds (iso_from_ms gives None for it)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and iso_from_ms(value) is None


def modified_filter(since: datetime) -> str:
    return f"((modified BETWEEN {epoch_ms(since)} AND {FAR_FUTURE_MS}))"


# -- mapping --------------------------------------------------------------------------------------

def _first_text(props: Mapping, *keys: str) -> str | None:
    for key in keys:
        value = props.get(key)
        if isinstance(value, str) and clean_text(value):
            return value
    return None


def feature_id(feature: Any) -> str | None:
    if not isinstance(feature, Mapping):
        return None
    props = feature.get("properties") if isinstance(feature.get("properties"), Mapping) else {}
    for value in (feature.get("id"), props.get("id")):
        if isinstance(value, (str, int)) and not isinstance(value, bool) and str(value).strip():
            return str(value).strip()
    return None


def to_package(feature: Mapping, site: str) -> dict:
    """A Hub search feature as a CKAN-shaped package. Raises BadRecord naming the item when it
    has no id or no title."""
    ident = feature_id(feature)
    props = feature.get("properties")
    if not isinstance(props, Mapping):
        raise BadRecord("not-an-object", f"item {ident!r}: no properties object", "properties", props)
    title = _first_text(props, "title", "name")
    problems = [p for p, bad in (("no id", ident is None), ("no title", title is None)) if bad]
    if problems:  # one problem (the message as it always was), coded by the first thing missing
        raise BadRecord("no-identifier" if ident is None else "no-title",
                        f"item {ident or props.get('title')!r}: {'; '.join(problems)}",
                        "id" if ident is None else "properties.title", None if ident is None else props.get("title"))
    if _past_any_calendar(props.get("modified")):
        raise BadRecord("bad-date", f"item {ident!r}: its modification date {props['modified']!r} (epoch milliseconds) "
                        "is past any calendar", "properties.modified", props["modified"])
    org = _first_text(props, "orgName", "source", "owner")
    licence = _first_text(props, "license", "licenseInfo")
    licence = clean_text(licence)[:MAX_LICENSE_CHARS] if licence else None
    resources = []
    if isinstance(props.get("url"), str) and props["url"].strip():
        resources.append({"url": props["url"].strip(), "format": props.get("type") or "",
                          "name": clean_text(title)})
    extras = {k: v for k, v in props.items() if k not in _MAPPED}
    for key in ("links", "time", "geometry"):
        if feature.get(key) is not None:
            extras[f"feature.{key}"] = feature[key]
    return {
        "id": ident,
        "title": title.strip(),
        "notes": _first_text(props, "description", "snippet"),
        "tags": [{"name": t} for t in text_list(props.get("tags"))],
        "groups": [{"name": c} for c in text_list(props.get("categories"))],
        "organization": {"title": clean_text(org), "name": clean_text(org)} if org else None,
        "license_id": licence,
        "metadata_created": iso_from_ms(props.get("created")),
        "metadata_modified": iso_from_ms(props.get("modified")),
        "resources": resources,
        "url": f"{site}/datasets/{ident}",
        "type": props.get("type"),
        "extras": extras,
    }


@screened_as_published(feature_id)
def normalize(feature: Any, site: str) -> DatasetRecord:
    """A Hub search feature as a DatasetRecord; an unusable one comes back failed, saying why (one
    too deep or too large fails before the mapping, a NaN or ±Infinity is null before it reads
    dates and tags: ``screened_as_published``)."""
    ident = feature_id(feature)
    try:
        if not isinstance(feature, Mapping):
            raise BadRecord("not-an-object", f"feature is {type(feature).__name__}, not a JSON object")
        pkg = to_package(feature, site)
    except ValueError as exc:
        return failed(ident, feature, coded(exc), prefix=f"{site}: ")
    title, description = clean_text(pkg["title"]), clean_text(pkg["notes"])
    org = pkg["organization"]
    created = feature["properties"].get("created")
    warnings = (problem("bad-optional-date", f"its creation date {created!r} (epoch milliseconds) is past any "
                        "calendar: stored without it", "properties.created", created),) if _past_any_calendar(created) else ()
    return package_record(pkg, source_id=pkg["id"], url=pkg["url"], url_hash=sha256_hex(normalize_url(pkg["url"])),
                          title=title, description=description,
                          tags=sorted({t["name"] for t in pkg["tags"]}), organization=org["title"] if org else None,
                          notes_text=description, warnings=warnings)


# -- over HTTP ------------------------------------------------------------------------------------
def _with_params(url: str, params: Mapping[str, Any]) -> str:
    parts = urlsplit(url)
    query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
    query.update({k: str(v) for k, v in params.items()})
    return urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(query), ""))


def _next_link(page: Mapping) -> str | None:
    for link in page.get("links") or []:
        if isinstance(link, Mapping) and link.get("rel") == "next" and isinstance(link.get("href"), str):
            return link["href"]
    return None


def _startindex(url: str) -> int | None:
    values = parse_qs(urlsplit(url).query).get("startindex")
    try:
        return int(values[-1]) if values else None
    except ValueError:
        return None


class ArcGisHubSource(CountsTraffic):
    """A Hub site's datasets through its OGC API Records search, GETs through ``fetcher``
    (harvester.http.HttpFetcher). After a listing: ``total`` (numberMatched), ``listed``,
    ``loop_cut`` (the paging was cut), ``complete``."""

    kind = KIND
    # incremental: the search filters on ``modified``; reconcile: it lists ids with ``fields``,
    # fetches chosen ones with ``id IN (...)`` and counts with ``limit=0``
    capabilities = Capabilities(incremental=True, reconcile=True)
    max_pages = 100_000

    def __init__(self, url: str, *, fetcher, portal: str | None = None):
        self.url = items_url(url)
        self.site = site_url(self.url)
        self.portal = portal or scrub_url(self.site)
        self.fetcher = fetcher
        self.total: int | None = None
        self.listed = 0
        self.loop_cut = False
        self.complete = False

    def __repr__(self) -> str:
        return f"ArcGisHubSource({scrub_url(self.url)!r})"


    def _get_page(self, url: str, filtered: bool) -> dict:
        where = f"{self.portal}: GET {scrub_url(url)}"

        def parse(resp):
            if resp.status_code == 400 and filtered:
                raise FilterRejected(f"{where}: the search refused the modified filter (HTTP 400)")
            if resp.status_code == 404:
                raise SourceError(f"{where}: HTTP 404 Not Found: no ArcGIS Hub search API at this URL "
                                  f"(is the portal's url a Hub site?)")
            if not 200 <= resp.status_code < 300:
                raise SourceError(f"{where}: HTTP {resp.status_code} {resp.reason or ''}".rstrip())
            try:
                page = loads(resp.content)  # (a page of any depth: sources/json_stream.py)
            except ValueError as exc:  # a cut body or a proxy's page: try again
                raise Retryable(f"the answer is not JSON ({exc})") from exc
            if not isinstance(page, Mapping) or not isinstance(page.get("features"), list):
                raise Retryable("the answer is not a FeatureCollection with a features list")
            return page

        return self.fetcher.get(url, parse=parse, what=where)

    def _raw_pages(self, params: Mapping[str, Any], page_size: int, since_ms: int | None) -> Iterator[list]:
        """The features of each page of the search with ``params``, following next links; sets
        ``total``, ``loop_cut`` and ``complete``. Raises ``FilterRejected`` when ``since_ms`` is
        given and a feature modified before it comes back."""
        self.total, self.loop_cut, self.complete = None, False, False
        page_size = max(1, min(page_size, MAX_LIMIT))
        url = _with_params(self.url, {"limit": page_size, "startindex": 1, **params})
        seen_urls: set[str] = set()
        seen_pages: set[tuple[str, ...]] = set()
        for _ in range(self.max_pages):
            seen_urls.add(url)
            page = self._get_page(url, since_ms is not None)
            if self.total is None and isinstance(page.get("numberMatched"), int):
                self.total = page["numberMatched"]
            features = page["features"]
            ids = tuple(feature_id(f) or f"#{i}" for i, f in enumerate(features))
            if features and ids in seen_pages:
                log.warning("%s: %s repeats an earlier page; listing cut there, nothing removed", self.portal,
                            scrub_url(url))
                self.loop_cut = True
                return
            seen_pages.add(ids)
            if since_ms is not None:
                older = [f for f in features if isinstance(f, Mapping) and isinstance(f.get("properties"), Mapping)
                         and isinstance(f["properties"].get("modified"), (int, float))
                         and f["properties"]["modified"] < since_ms]
                if older:
                    raise FilterRejected(
                        f"{self.portal}: GET {scrub_url(url)} ignored the modified filter: item "
                        f"{feature_id(older[0])!r} was modified at {iso_from_ms(older[0]['properties']['modified'])}, "
                        f"before {iso_from_ms(since_ms)}")
            if features:
                yield features
            start = _startindex(url) or 1
            link = _next_link(page)
            if link is None:  # no next link: numberMatched (exact), else only an empty page, says it is the end
                matched = page.get("numberMatched")
                # (issue 36) without a count, a short page is no proof: the server may cap its pages
                if not features or (isinstance(matched, int) and start - 1 + len(features) >= matched):
                    self.complete = True
                    return
                link = _with_params(url, {"startindex": start + len(features)})
            if not features:
                self.complete = True
                return
            next_start = _startindex(link)
            if link in seen_urls or (next_start is not None and next_start <= start):
                log.warning("%s: the next page (%s) does not move past %s; listing cut there, nothing removed",
                            self.portal, scrub_url(link), scrub_url(url))
                self.loop_cut = True
                return
            url = link
        log.warning("%s: more than %d pages; listing stopped before %s, nothing removed", self.portal,
                    self.max_pages, scrub_url(url))
        self.loop_cut = True

    def iter_pages(self, since: datetime | None = None, page_size: int = 100) -> Iterator[list[DatasetRecord]]:
        """Pages of records: all items, or those modified at or after ``since``."""
        self.listed = 0
        params = {"filter": modified_filter(since)} if since is not None else {}
        for features in self._raw_pages(params, page_size, epoch_ms(since) if since is not None else None):
            records = [normalize(f, self.site) for f in features]
            self.listed += len(records)
            yield records

    def iter_records(self, since: datetime | None, page_size: int, listing: Listing,
                     validators: dict | None = None) -> Iterator[list[DatasetRecord]]:
        """The Source protocol (sources/base.py). ``listing.complete``: an unfiltered listing that
        ended by itself (not cut)."""
        yield from self.iter_pages(since, page_size=page_size)
        listing.complete = since is None and self.complete and not self.loop_cut

    # -- reconciliation (sources/base.py): the search lists ids cheaply and fetches chosen ones ----
    def list_ids(self, page_size: int) -> Iterator[IdPage]:
        """Every item's id and modified date (``fields=id,modified``, paged like any listing). A
        server that ignores ``fields`` sends whole features: they come normalized in ``records``.
        A listing cut by a page loop raises SourceError: an incomplete list of ids must not be
        taken for the portal's (it would remove what it missed)."""
        for features in self._raw_pages({"fields": LIST_FIELDS}, page_size, None):
            ids, unusable, whole = [], 0, []
            for feature in features:
                ident = feature_id(feature)
                if ident is None:
                    unusable += 1
                    continue
                props = feature.get("properties") if isinstance(feature.get("properties"), Mapping) else {}
                modified = parse_timestamp(iso_from_ms(props.get("modified")))
                ids.append((ident, to_ms(modified) if modified else None))
                if set(props) - set(LIST_FIELDS.split(",")):
                    whole.append(feature)
            yield IdPage(ids, unusable, [normalize(f, self.site) for f in whole],
                         f"fields={LIST_FIELDS}" if whole else "")
        if self.loop_cut:
            raise SourceError(f"{self.portal}: the identifier listing of {scrub_url(self.url)} came round "
                              f"again; it is incomplete and cannot be reconciled with")

    def fetch_by_ids(self, ids: list[str], per_request: int = 100) -> Iterator[list[DatasetRecord]]:
        """The items of ``ids``, ``per_request`` a request (``filter=((id IN (a, b)))``, the Hub's
        own form of a multi-value predicate). Items no longer shown are left out."""
        wanted = list(dict.fromkeys(ids))
        for i in range(0, len(wanted), per_request):
            chunk = wanted[i:i + per_request]
            cql = "((id IN (" + ", ".join(_cql_value(v) for v in chunk) + ")))"
            asked = set(chunk)
            for features in self._raw_pages({"filter": cql}, len(chunk), None):
                page = [normalize(f, self.site) for f in features if feature_id(f) in asked]
                if page:
                    yield page

    def count(self) -> int | None:
        """numberMatched of a ``limit=0`` search: one request."""
        page = self._get_page(_with_params(self.url, {"limit": 0, "startindex": 1}), False)
        matched = page.get("numberMatched")
        return matched if isinstance(matched, int) and not isinstance(matched, bool) else None


def _cql_value(value: str) -> str:
    """A value in a Hub CQL list: bare when it is a plain token, else quoted (quotes doubled)."""
    if re.fullmatch(r"[A-Za-z0-9_.-]+", value):
        return value
    return "'" + value.replace("'", "''") + "'"
