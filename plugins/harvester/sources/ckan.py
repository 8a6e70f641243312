"""CKAN Action API client: status, package_show and a keyset-paged package listing.

Listing (``iter_pages``) always asks for ``sort=metadata_modified asc, id asc`` and pages by
KEYSET on ``metadata_modified``, not by growing ``start`` offsets, so records that move while
we list (a dataset modified mid-listing jumps to the end) are neither skipped nor shift others
out of view. Solr indexes dates with millisecond precision, so every comparison here is on the
timestamp truncated to the millisecond (the "key"):

* each request filters ``fq=metadata_modified:[<boundary> TO *]`` (inclusive), where the boundary
  is the key of the last record received; the records at the boundary are fetched again and
  dropped by id (only the ids seen at the current boundary are kept, not every id);
* when a whole page shares the boundary key (a tie group larger than a page, e.g. a bulk
  import), the next request stays on the same ``fq`` and moves ``start`` through the tie group.
  Such requests start one record early (and ask one row more): that record must be one we
  already have; if it is not, records of the group disappeared under us (modified, so moved to
  the end) and shifted the rest, and we step back a page rather than skip one;
* the listing ends when a page reaches the result's ``count``.

A portal that rejects the ``fq`` raises ``FilterRejected`` for a modified-since listing (the
caller falls back to a full sync; no other error may make it do so); a full listing
(``since=None``) then carries on without any ``fq``: plain ``start`` offsets in the same sort,
with the same overlap check and de-duplication (and later full listings on the same client start
that way).

Reconciliation uses two more calls: ``iter_pages(fields=("id", "metadata_modified"))`` lists only
those fields (``fl``; about 80 bytes a dataset instead of several KB), keyset-paged the same way,
and ``fetch_by_ids`` fetches chosen records in full, ``package_search`` with ``fq=id:("a" OR ...)``
(``package_show`` one by one where the portal refuses or ignores that filter). ``count()`` is one
``rows=0`` request. ``requests_made`` and ``bytes_received`` count every request and every body byte
as it came over the wire (compressed, if the portal compresses).

HTTP is harvester.http's ``HttpFetcher`` (``client.http``): retries with backoff and Retry-After,
politeness delay, counters, auth, timeouts, scrubbed messages. This module adds what is CKAN's: the
action URLs, the ``{"success": ..., "result": ...}`` envelope and CKAN's errors.

Failures: 5xx, 429, timeouts and connection errors are retried with backoff, and so is a 2xx answer
that is not a CKAN answer (an HTML page, invalid JSON, no ``success: true`` envelope: usually a
proxy's or a captive portal's page standing in for an error); when the retries are spent they raise
``PortalUnavailable``. CKAN's own error answers (4xx with its JSON error body) are not retried:
``CkanError``, or ``FilterRejected`` for a refused ``fq``.

Credentials: ``api_key`` (a CKAN API token) goes in the ``Authorization`` header and makes listings
ask for ``include_private=true`` (the private datasets the token's account may read);
``basic_auth`` (user, password), or a user:password in the URL, is sent as HTTP Basic auth (for a
proxy in front of the portal). Neither ever appears in a log line, a message or ``repr``.
"""
from __future__ import annotations

import logging
from datetime import datetime, timezone
from typing import Any, Iterator

import requests

from harvester.config.portals import CKAN
from harvester.domain.dataset import DatasetRecord, normalize, parse_timestamp
from harvester.http import HttpFetcher, RetriesExhausted, Retryable, scrub_url, split_userinfo
from harvester.sources.base import Capabilities, IdPage, Listing, SourceError, SourceUnavailable, to_ms
from harvester.sources.base import FilterRejected as SourceFilterRejected
from harvester.sources.json_stream import answer_json

log = logging.getLogger(__name__)

LISTING_SORT = "metadata_modified asc, id asc"
LISTING_FIELDS = ("id", "metadata_modified")  # what a reconciliation lists of every dataset (fl)
ROWS_MAX = 1000  # CKAN's default ckan.search.rows_max: larger `rows` are silently cut to it
_MAX_KEY = datetime.max.replace(tzinfo=timezone.utc)  # records without a timestamp: Solr sorts them last
_MAX_STEPBACKS = 100


class CkanError(SourceError):
    """A CKAN Action API call failed. ``transient`` tells whether trying later may help."""

    transient = False

    def __init__(self, message: str, *, portal: str | None = None, action: str | None = None,
                 status: int | None = None, error_type: str | None = None):
        super().__init__(message)
        self.portal, self.action, self.status, self.error_type = portal, action, status, error_type


class PortalUnavailable(CkanError, SourceUnavailable):
    """Transient failures (5xx, 429, timeouts, connection errors) that outlived the retries."""

    transient = True


class FilterRejected(CkanError, SourceFilterRejected):
    """The portal refused (or ignored) our ``fq``: terminal; fall back to a full listing."""


class _NotCkanAnswer(Retryable):
    """A 2xx answer that CKAN did not write (HTML, invalid JSON, no success envelope): retried."""


# -- helpers ---------------------------------------------------------------------------------------
# A CKAN timestamp (UTC without a zone; DKAN's with a space for the T; zoned values converted) as an
# aware UTC datetime, None when missing or unparseable: the domain's one parser of record timestamps.
parse_ckan_timestamp = parse_timestamp


def solr_date(dt: datetime) -> str:
    """``2013-06-17T11:50:00.123Z``: UTC, milliseconds rounded down."""
    dt = to_ms(dt)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{dt.microsecond // 1000:03d}Z"


def modified_since_fq(dt: datetime) -> str:
    return f"metadata_modified:[{solr_date(dt)} TO *]"


def _solr_phrase(value: str) -> str:
    """A value as a quoted Solr phrase (backslashes and quotes escaped)."""
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def _identity(rec: Any) -> Any:
    """What tells a listed record from another: its id; for a record without one (a broken portal:
    the record fails, and must still be listed, and reported, once), its name and dates. Two pages
    of id-less records are not "the same page" for lack of ids."""
    if not isinstance(rec, dict):
        return None
    ident = rec.get("id")
    if ident is not None:
        return ident
    return ("no-id", str(rec.get("name")), str(rec.get("metadata_modified")), str(rec.get("metadata_created")))


def _record_key(rec: dict) -> datetime:
    dt = parse_ckan_timestamp(rec.get("metadata_modified"))
    return _MAX_KEY if dt is None else to_ms(dt)


def _error_text(body: Any) -> tuple[str | None, str]:
    """(``__type``, message) of a CKAN error body."""
    if isinstance(body, str):  # CKAN's "Bad request - ..." answers are a bare JSON string
        return None, body
    if not isinstance(body, dict):
        return None, repr(body)[:300]
    err = body.get("error", body)
    if not isinstance(err, dict):
        return None, str(err)[:300]
    etype = err.get("__type")
    if err.get("message") is not None:
        return etype, str(err["message"])
    fields = [f"{k}: {'; '.join(map(str, v)) if isinstance(v, list) else v}"
              for k, v in err.items() if k != "__type"]
    return etype, ", ".join(fields) or "(no message)"


def _shorten(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _snippet(resp: requests.Response) -> str:
    text = " ".join((resp.text or "")[:200].split())
    return text[:120] or "(empty body)"


# -- the client ---------------------------------------------------------------------------------
class CkanClient:
    """One CKAN portal's Action API (``<base_url>/api/3/action/...``), over ``http`` (an
    ``HttpFetcher`` made from the HTTP settings given here).

    ``requests_made`` counts every HTTP request sent, retries included; ``bytes_received`` the
    bytes of every response body received, as they came over the wire. ``total`` is the ``count``
    of the latest listing's first answer (how many records it expected), None before; ``cut``
    says why the latest listing stopped before its end (None when it was not cut).
    """

    def __init__(self, base_url: str, *, timeout: float = 60, max_retries: int = 5, backoff: float = 1.0,
                 max_backoff: float = 60, politeness_delay: float = 0.2, user_agent: str = "harvester/0.1",
                 session: requests.Session | None = None, api_key: str | None = None,
                 basic_auth: tuple[str, str] | None = None):
        base = base_url.strip().rstrip("/")
        for suffix in ("/api/3/action", "/api/action", "/api/3", "/api"):
            if base.endswith(suffix):
                base = base[: -len(suffix)]
                break
        self.portal = scrub_url(base)
        self.base_url, url_auth = split_userinfo(base)
        basic_auth = basic_auth or url_auth
        self.include_private = bool(api_key)
        if api_key and basic_auth:
            log.warning("%s: an api_key is given, so the user:password for the portal is not used", self.portal)
        self.http = HttpFetcher(self.portal, timeout=timeout, max_retries=max_retries, backoff=backoff,
                                max_backoff=max_backoff, politeness_delay=politeness_delay, user_agent=user_agent,
                                headers={"Accept": "application/json"}, session=session,
                                header_auth=("Authorization", api_key) if api_key else None,
                                basic_auth=None if api_key else basic_auth)
        self.total: int | None = None
        self.cut: str | None = None
        self._fq_rejected = False
        self._ids_fq_rejected = False

    def __repr__(self) -> str:
        return f"CkanClient({self.portal!r})"

    @property
    def requests_made(self) -> int:
        return self.http.requests_made

    @property
    def bytes_received(self) -> int:
        return self.http.bytes_received

    # public calls -----------------------------------------------------------------------------
    def status(self) -> dict:
        """``status_show``: ckan_version, site_url, extensions..."""
        return self._call("status_show", {})

    def package_show(self, id_or_name: str) -> dict:
        return self._call("package_show", {"id": id_or_name})

    def package_search(self, *, fq: str | None = None, start: int = 0, rows: int = 1000,
                       sort: str = LISTING_SORT, q: str = "*:*", fl: str | None = None) -> dict:
        """One raw ``package_search`` (``{"count", "results", ...}``)."""
        params: dict[str, Any] = {"q": q, "sort": sort, "rows": rows, "start": start}
        if self.include_private:
            params["include_private"] = "true"
        if fq:
            params["fq"] = fq
        if fl:
            params["fl"] = fl
        result = self._call("package_search", params, fq=fq)
        if not isinstance(result, dict) or not isinstance(result.get("results"), list):
            raise CkanError(f"{self.portal} package_search: unexpected result shape",
                            portal=self.portal, action="package_search")
        return result

    def count(self) -> int:
        """How many datasets the portal lists (one ``package_search`` with ``rows=0``)."""
        count = self.package_search(rows=0)["count"]
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise CkanError(f"{self.portal} package_search: no usable count in the answer ({count!r})",
                            portal=self.portal, action="package_search")
        return count

    def iter_pages(self, since: datetime | None = None, page_size: int = 1000,
                   fields: tuple[str, ...] | None = None) -> Iterator[list[dict]]:
        """Yield pages of raw package dicts, oldest ``metadata_modified`` first: every dataset
        (``since=None``) or those modified at or after ``since`` (naive means UTC). Each dataset
        comes once per listing, except one modified during the listing, which comes again with
        its new version at the end. Empty pages are not yielded. ``fields`` asks for only those
        fields (``fl``; they must include ``id`` and ``metadata_modified``, which paging needs);
        a portal may ignore it and send whole records. A portal that answers a request with the
        very page it answered the one before (it ignores ``start`` or the keyset's ``fq``) would
        have the listing step over what it never sent: the listing stops there with a warning,
        and ``cut`` says so."""
        if fields is not None and not {"id", "metadata_modified"} <= set(fields):
            raise ValueError(f"fields {fields!r} must include 'id' and 'metadata_modified' (paging needs them)")
        fl = ",".join(fields) if fields else None
        if page_size < 1:
            raise ValueError("page_size must be at least 1")
        if since is not None and not isinstance(since, datetime):
            parsed = parse_ckan_timestamp(since)
            if parsed is None:
                raise ValueError(f"since must be a datetime, not {since!r}")
            since = parsed
        boundary: datetime | None = to_ms(since) if since is not None else None
        seen: set[Any] = set()  # identities (_identity) of the records received whose key == boundary
        use_fq = not (since is None and self._fq_rejected)
        if not use_fq:
            log.info("%s: listing without fq (the portal rejected it before)", self.portal)
        pos = 0  # position of the next unread record in the current result list
        stepbacks = 0
        first = True
        yielded = 0
        requests_before = self.requests_made  # (the client's count runs across listings)
        self.cut = None
        last_ids: tuple | None = None  # the ids of the previous answer, in order

        def fq_for(b: datetime | None) -> str | None:
            return modified_since_fq(b) if use_fq and b is not None and b is not _MAX_KEY else None

        while True:
            overlap = pos > 0
            start = pos - 1 if overlap else 0
            rows = page_size + 1 if overlap and page_size < ROWS_MAX else page_size
            fq = fq_for(boundary)
            fq_boundary = boundary
            try:
                result = self.package_search(fq=fq, start=start, rows=rows, fl=fl)
                page = result["results"]
                if fl and any(not isinstance(r, dict) for r in page):
                    raise CkanError(f"{self.portal} package_search: fl={fl!r} answered with something other "
                                    "than records", portal=self.portal, action="package_search")
                keys = [_record_key(r) for r in page]
                self._check_order(keys, fq, fq_boundary)
            except FilterRejected as exc:
                if fq is None:
                    raise
                self._fq_rejected = True  # a full listing on this client will not try fq again
                if since is not None:
                    raise
                log.warning("%s rejected the listing filter (%s); listing on without fq", self.portal, exc)
                use_fq, pos, last_ids = False, 0, None
                continue
            ids = tuple(_identity(r) for r in page)
            if page and ids == last_ids:
                self.cut = (f"{self.portal} package_search: the answer at start={start} repeats the page "
                            f"before it; the listing stops there, incomplete ({yielded} records)")
                log.warning("%s", self.cut)
                break
            last_ids = ids
            count = result.get("count")
            if first:
                self.total = count if isinstance(count, int) else None
                first = False

            def received(i: int) -> bool:
                return boundary is not None and (keys[i] < boundary or (keys[i] == boundary
                                                                        and _identity(page[i]) in seen))

            if overlap and (not page or not received(0)):
                # the record just before `pos` is not one we have: records before it vanished
                # (modified, so moved to the end) and shifted the rest; never skip, step back
                stepbacks += 1
                if stepbacks > _MAX_STEPBACKS:
                    raise CkanError(f"{self.portal} package_search: the catalogue keeps changing under "
                                    f"the listing; gave up after {_MAX_STEPBACKS} step-backs",
                                    portal=self.portal, action="package_search")
                log.info("%s: listing shifted at start=%s; stepping back", self.portal, start)
                pos, last_ids = max(0, pos - page_size), None  # (the page stepped back to may be this one)
                continue

            fresh = []
            for i, rec in enumerate(page):
                if received(i):
                    continue
                fresh.append(rec)
                if boundary is None or keys[i] > boundary:
                    boundary, seen = keys[i], {_identity(rec)}
                else:
                    seen.add(_identity(rec))
            missing = sum(1 for k in keys if k is _MAX_KEY)
            if missing:
                log.warning("%s: %d record(s) without a usable metadata_modified", self.portal, missing)
            log.debug("%s package_search start=%s rows=%s fq=%s: %s records, %s new, count=%s",
                      self.portal, start, rows, fq, len(page), len(fresh), count)
            if fresh:
                yielded += len(fresh)
                yield fresh
            if not page:
                break
            if isinstance(count, int):
                if start + len(page) >= count:
                    break  # CKAN's count (Solr's numFound) is exact: all were listed
            elif overlap and len(page) == 1:
                break  # no count: nothing after the record we stood on (the empty page's equivalent)
            # No count (not CKAN's own answer): a short page is no proof of the end, since
            # ckan.search.rows_max may cut pages below ``rows`` (issue 36); an empty one is.
            if fq_for(boundary) != fq:
                # keyset step: the next result list starts with this page's records at the new
                # boundary (all seen), so go on right after them
                pos = sum(1 for k in keys if k == boundary)
            else:
                new_pos = start + len(page)
                if new_pos <= pos:
                    raise CkanError(f"{self.portal} package_search: listing made no progress at "
                                    f"start={start} (pages of {len(page)} records)",
                                    portal=self.portal, action="package_search")
                pos = new_pos
        made = self.requests_made - requests_before
        log.info("%s: listing done: %d records in %d request%s", self.portal, yielded, made, "" if made == 1 else "s")

    def fetch_by_ids(self, ids: list[str], per_request: int = 100) -> Iterator[list[dict]]:
        """Yield the records of ``ids`` in full, a page per request: ``package_search`` with
        ``fq=id:("a" OR "b" ...)`` (at most ``per_request`` ids, keeping URLs short). A portal that
        refuses that filter, or ignores it (answers with records not asked for), is asked with
        ``package_show`` one id at a time instead, for the rest of this client's life. Ids the
        portal no longer shows (deleted or hidden since they were listed) are left out."""
        if per_request < 1:
            raise ValueError("per_request must be at least 1")
        for i in range(0, len(ids), per_request):
            batch = ids[i:i + per_request]
            if not self._ids_fq_rejected:
                try:
                    yield self._search_ids(batch)
                    continue
                except FilterRejected as exc:
                    self._ids_fq_rejected = True
                    log.warning("%s: fetching records by id with package_show, one request each (%s)",
                                self.portal, _shorten(str(exc)))
            page = [rec for rec in (self._show_or_none(x) for x in batch) if rec is not None]
            if page:
                yield page

    def _search_ids(self, batch: list[str]) -> list[dict]:
        fq = "id:(" + " OR ".join(_solr_phrase(x) for x in batch) + ")"
        result = self.package_search(fq=fq, start=0, rows=len(batch))
        wanted = set(batch)
        page = result["results"]
        strays = [r.get("id") if isinstance(r, dict) else r for r in page
                  if not isinstance(r, dict) or r.get("id") not in wanted]
        if strays:
            raise FilterRejected(f"{self.portal} package_search: the portal ignored fq id:(...) (answered with "
                                 f"{len(strays)} records not asked for)", portal=self.portal, action="package_search")
        return page

    def _show_or_none(self, id_: str) -> dict | None:
        try:
            rec = self.package_show(id_)
        except CkanError as exc:
            if exc.status in (403, 404):  # deleted or hidden since it was listed
                log.info("%s: %s is no longer shown (HTTP %s)", self.portal, id_, exc.status)
                return None
            raise
        return rec if isinstance(rec, dict) else None

    def _check_order(self, keys: list[datetime], fq: str | None, fq_boundary: datetime | None) -> None:
        if fq is not None and any(k < fq_boundary or k is _MAX_KEY for k in keys):
            raise FilterRejected(f"{self.portal} package_search: the portal ignored fq {fq!r} "
                                 "(returned records outside it)", portal=self.portal, action="package_search")
        if any(b < a for a, b in zip(keys, keys[1:])):
            raise CkanError(f"{self.portal} package_search: the portal did not honour sort={LISTING_SORT!r}",
                            portal=self.portal, action="package_search")

    # HTTP ---------------------------------------------------------------------------------------
    def _call(self, action: str, params: dict, *, fq: str | None = None) -> Any:
        """One action's ``result``, through the shared retrying path (harvester.http), where an answer CKAN
        did not write (``_NotCkanAnswer``) is retried like a 5xx."""
        what = f"{self.portal} {action}"
        try:
            return self.http.get(f"{self.base_url}/api/3/action/{action}", params=params, what=what,
                                 parse=lambda resp: self._result(action, resp, fq))
        except RetriesExhausted as exc:
            raise PortalUnavailable(f"{what}: portal unavailable after {exc.attempts} attempts (last: {exc.last})",
                                    portal=self.portal, action=action, status=exc.status) from None

    def _result(self, action: str, resp: requests.Response, fq: str | None) -> Any:
        status = resp.status_code
        try:
            body = answer_json(resp)  # (a page of any depth: sources/json_stream.py)
        except ValueError:
            if 200 <= status < 300:
                ctype = resp.headers.get("Content-Type", "no content type")
                raise _NotCkanAnswer(f"HTTP {status}, not a JSON answer ({ctype}): {_snippet(resp)}") from None
            raise CkanError(f"{self.portal} {action}: HTTP {status}, not a JSON answer "
                            f"({resp.headers.get('Content-Type', 'no content type')}): {_snippet(resp)}",
                            portal=self.portal, action=action, status=status) from None
        if 200 <= status < 300:
            if isinstance(body, dict) and body.get("success") is True and "result" in body:
                return body["result"]
            if isinstance(body, dict) and body.get("success") is False:
                etype, msg = _error_text(body)
                raise _NotCkanAnswer(f"HTTP {status} with success: false, {etype or 'error'}: {_shorten(msg, 200)}")
            raise _NotCkanAnswer(f"HTTP {status}, not a CKAN action answer: {_snippet(resp)}")
        etype, msg = _error_text(body)
        text = f"{self.portal} {action}: HTTP {status}{' ' + etype if etype else ''}: {msg}"
        if action == "package_search" and fq and status in (400, 409):
            raise FilterRejected(f"{text} (fq {fq!r})", portal=self.portal, action=action, status=status,
                                 error_type=etype)
        raise CkanError(text, portal=self.portal, action=action, status=status, error_type=etype)


# -- the source ------------------------------------------------------------------------------------
class CkanSource:
    """A CKAN portal as a source (sources/base.py): modified-since listings filtered by the portal,
    records normalized into DatasetRecords, and reconciliation (``list_ids``, ``fetch_by_ids``,
    ``count``) over the Action API (``client``)."""

    kind = CKAN
    capabilities = Capabilities(incremental=True, reconcile=True)

    def __init__(self, client: CkanClient, portal_url: str):
        self.client, self.portal_url = client, portal_url

    def __repr__(self) -> str:
        return f"CkanSource({self.client!r})"

    @property
    def requests_made(self) -> int:
        return self.client.requests_made

    @property
    def bytes_received(self) -> int:
        return self.client.bytes_received

    @property
    def total(self) -> int | None:
        return self.client.total

    def records(self, packages: list) -> list[DatasetRecord]:
        return [normalize(pkg, self.portal_url) for pkg in packages]

    def iter_records(self, since: datetime | None, page_size: int, listing: Listing,
                     validators: dict | None = None) -> Iterator[list[DatasetRecord]]:
        for page in self.client.iter_pages(since, page_size=page_size):
            yield self.records(page)
        listing.complete = since is None and self.client.cut is None

    # reconciliation (sources/base.py) ----------------------------------------------------------
    def list_ids(self, page_size: int) -> Iterator[IdPage]:
        """Every dataset's id and metadata_modified (``fl``, keyset-paged like any listing). A
        portal that ignores ``fl`` sends whole records: they come normalized in ``records``."""
        for page in self.client.iter_pages(None, page_size=page_size, fields=LISTING_FIELDS):
            ids, unusable = [], 0
            for rec in page:
                source_id = rec.get("id") if isinstance(rec, dict) else None
                if isinstance(source_id, str) and source_id.strip():
                    modified = parse_timestamp(rec.get("metadata_modified"))
                    ids.append((source_id.strip(), to_ms(modified) if modified else None))
                else:
                    unusable += 1
            full = [rec for rec in page if isinstance(rec, dict) and set(rec) - set(LISTING_FIELDS)]
            yield IdPage(ids, unusable, self.records(full), f"fl={','.join(LISTING_FIELDS)}" if full else "")
        if self.client.cut is not None:
            raise CkanError(f"{self.client.cut}; an incomplete identifier listing cannot be reconciled with",
                            portal=self.client.portal, action="package_search")

    def fetch_by_ids(self, ids: list[str], per_request: int = 100) -> Iterator[list[DatasetRecord]]:
        for page in self.client.fetch_by_ids(ids, per_request=per_request):
            yield self.records(page)

    def count(self) -> int:
        return self.client.count()
