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

A listing page is read as it streams (``_Streamed``: Python's json decoder reads one record at a
time from a window of a MB of the body) and its records are handed on in slices of at most
``slice_bytes`` (SLICE_BYTES, 2 MB) of the answer, never the whole body nor the whole page as
objects: a page of 1,000 real records with their resources lists is tens of MB of JSON and several
times that as objects (issue 40). Each record is checked as it comes (fl, the fq's range, the sort
order, the overlap); a page repeating the one before and the count are judged once it is read. The
page keeps the size cap of a body read whole (``HARVESTER_FETCH_MAX_BYTES``) and the request's
deadline. An answer that is not CKAN's before its first record is retried like any; one that
breaks off after records of it were handed on is asked again and read whole (its first records
must be those already handed on), and fails naming the page when it never reads whole: what was
handed on (staged) stays.

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

import codecs
import json
import logging
import re
from datetime import datetime, timezone
from typing import Any, Iterator

import requests
import urllib3

from harvester.config.portals import CKAN
from harvester.domain.dataset import DatasetRecord, normalize, parse_timestamp
from harvester.http import (HttpFetcher, RetriesExhausted, Retryable, failure_text, scrub_url, split_userinfo,
                            streamed_bytes, wire_bytes)
from harvester.sources.base import Capabilities, IdPage, Listing, SourceError, SourceUnavailable, to_ms
from harvester.sources.base import FilterRejected as SourceFilterRejected
from harvester.sources.json_stream import answer_json

log = logging.getLogger(__name__)

LISTING_SORT = "metadata_modified asc, id asc"
LISTING_FIELDS = ("id", "metadata_modified")  # what a reconciliation lists of every dataset (fl)
ROWS_MAX = 1000  # CKAN's default ckan.search.rows_max: larger `rows` are silently cut to it
_MAX_KEY = datetime.max.replace(tzinfo=timezone.utc)  # records without a timestamp: Solr sorts them last
_MAX_STEPBACKS = 100
# A listing hands its records on in slices of at most this many bytes of the answer (and at most a
# page): a page of 1,000 real records is tens of MB of JSON and several times that as objects.
SLICE_BYTES = 2 * 2**20


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


class _Whole:
    """A listing page's answer that was read whole after all (see ``CkanClient._open_page``), as a
    ``_Streamed`` is read."""

    success = True

    def __init__(self, result: Any):
        if not isinstance(result, dict) or not isinstance(result.get("results"), list):
            raise CkanError("package_search: unexpected result shape (read whole)", action="package_search")
        self.result, self.count = result, result.get("count")
        self.body = _Counted(None)

    def records(self) -> Iterator[Any]:
        results, self.result = self.result["results"], None
        yield from results

    def close(self) -> None:
        pass


class _PageRead:
    """What the listing learns of a page as it reads it: the answer's ``count`` and how many bytes
    of it were read (what slices it)."""

    def __init__(self):
        self.count: Any = None
        self.stream: _Streamed | None = None

    def bytes_read(self) -> int:
        return self.stream.body.read_bytes if self.stream is not None else 0


class _Counted:
    """A streamed body (urllib3, decoded as it comes) that counts the bytes read of it."""

    def __init__(self, raw):
        self.raw, self.read_bytes = raw, 0
        self.kept: list[bytes] | None = []  # what was read before the first record (then None)

    def read(self, size: int = -1) -> bytes:
        data = self.raw.read(size)
        self.read_bytes += len(data)
        if self.kept is not None:
            self.kept.append(data)
        return data


class _Streamed:
    """One ``package_search`` answer read as it streams, a record at a time: the body is decoded
    (UTF-8) a MB at a time into a text window, and each value is read by Python's own JSON decoder
    (``raw_decode``, in C: a page of 1,000 real records in a third of the time ``json.loads`` of
    the whole takes, four times faster than building records from ijson's events), so a record
    reads exactly as ``resp.json()`` reads it (NaN, lone surrogates...). Opening it (``open``) reads
    the envelope up to the first record (``success``, ``count`` when they come first);
    ``records()`` then yields the records and reads the rest of the answer; ``count`` and
    ``success`` are known at the latest once ``records()`` is spent. Never the whole body as one
    bytes object, nor the page as one tree: what is held is the window (a MB or two, more only for a
    record larger than that). ValueError for what is not JSON or not this shape (RecursionError for
    a record nested deeper than Python's json reads: the page is then read whole, by
    ``json_stream``). ``close()`` releases the connection and counts the bytes received."""

    CHUNK = 2**20  # the most read at once (half a slice, when slices are smaller)

    def __init__(self, client: "CkanClient", resp: requests.Response):
        self.client, self.resp = client, resp
        raw = resp.raw
        raw.decode_content = True  # a gzip / deflate Content-Encoding undone as the body streams
        self.body = _Counted(raw)
        self.chunk = max(2**16, min(self.CHUNK, client.slice_bytes // 2))  # (a slice: a few reads)
        self._decoder = codecs.getincrementaldecoder("utf-8")()  # (strict: other bytes, read whole)
        self._buf = ""
        self._pos = 0
        self._eof = False
        self._first = True
        self.count: Any = None
        self.success: Any = None
        self.has_results = False
        self.result_shape = True
        self.read = 0  # records read
        self._closed = False

    # the window ----------------------------------------------------------------------------------
    def _fill(self) -> None:
        data = self.body.read(self.chunk)
        if self._first and data:
            self._first = False
            if data.startswith(codecs.BOM_UTF8):
                data = data[3:]
            elif b"\x00" in data[:4]:
                raise ValueError("the answer is not UTF-8")
        text = self._decoder.decode(data, final=not data)
        if not data:
            self._eof = True
        self._buf = self._buf[self._pos:] + text
        self._pos = 0

    def _peek(self) -> str:
        """The next character that is not white space ('' at the end of the answer)."""
        while True:
            pos = _WS.match(self._buf, self._pos).end()
            self._pos = pos
            if pos < len(self._buf):
                return self._buf[pos]
            if self._eof:
                return ""
            self._fill()

    def _expect(self, char: str, what: str) -> None:
        got = self._peek()
        if got != char:
            raise ValueError(f"expected {char!r} {what}, found {got[:1]!r}" if got else
                             f"the document ends where {char!r} {what} was expected")
        self._pos += 1

    def _value(self) -> Any:
        """The JSON value at the window's position, more of the body read while it is incomplete."""
        while True:
            self._peek()
            try:
                value, end = _DECODER.raw_decode(self._buf, self._pos)
            except json.JSONDecodeError as exc:
                if self._eof:
                    raise ValueError(f"{exc.msg} (at character {exc.pos - self._pos} of a value)") from None
                self._fill()
                continue
            if end >= len(self._buf) and not self._eof:  # (a number may go on in the next MB)
                self._fill()
                continue
            self._pos = end
            return value

    def _members(self, what: str) -> Iterator[str]:
        """The keys of the object whose ``{`` was just read, each with the window before its value."""
        if self._peek() == "}":
            self._pos += 1
            return
        while True:
            key = self._value()
            if not isinstance(key, str):
                raise ValueError(f"a key of {what} is not a string")
            self._expect(":", f"after a key of {what}")
            yield key
            got = self._peek()
            self._pos += 1
            if got == "}":
                return
            if got != ",":
                raise ValueError(f"expected ',' or '}}' in {what}, found {got[:1]!r}" if got else
                                 f"the document ends inside {what}")

    # the answer ------------------------------------------------------------------------------------
    def open(self) -> None:
        """Reads up to the first record of ``result.results`` (or to the end of an answer that has
        none)."""
        self._expect("{", "(an answer is a JSON object)")
        self._envelope = self._members("the answer")
        for key in self._envelope:
            if key == "result" and self._peek() == "{":
                self._pos += 1
                self._result = self._members("the result")
                for rkey in self._result:
                    if rkey == "results" and self._peek() == "[":
                        self._pos += 1
                        self.has_results = True
                        self.body.kept = None
                        return
                    value = self._value()
                    if rkey == "count":
                        self.count = value
            else:
                value = self._value()
                if key == "success":
                    self.success = value
                elif key == "result":
                    self.result_shape = False
        self._end()

    def _end(self) -> None:
        if self._peek():
            raise ValueError("extra data after the answer")

    def records(self) -> Iterator[Any]:
        """The records, then the rest of the answer read."""
        try:
            if self.has_results:
                if self._peek() == "]":
                    self._pos += 1
                else:
                    while True:
                        yield self._value()
                        self.read += 1
                        got = self._peek()
                        self._pos += 1
                        if got == "]":
                            break
                        if got != ",":
                            raise ValueError(f"expected ',' or ']' after record {self.read}, found {got[:1]!r}"
                                             if got else f"the document ends after record {self.read}")
                for rkey in self._result:
                    value = self._value()
                    if rkey == "count":
                        self.count = value
                for key in self._envelope:
                    value = self._value()
                    if key == "success":
                        self.success = value
                self._end()
        finally:
            self.close()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._buf = ""
            self.client.http.add_bytes(streamed_bytes(self.resp.raw))
            self.resp.close()


_WS = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()


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
        self.slice_bytes = SLICE_BYTES  # a listing's slices: at most this many bytes of its answer
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
        """One raw ``package_search`` (``{"count", "results", ...}``), read whole."""
        params = self._search_params(fq=fq, start=start, rows=rows, sort=sort, q=q, fl=fl)
        result = self._call("package_search", params, fq=fq)
        if not isinstance(result, dict) or not isinstance(result.get("results"), list):
            raise CkanError(f"{self.portal} package_search: unexpected result shape",
                            portal=self.portal, action="package_search")
        return result

    def _search_params(self, *, fq: str | None = None, start: int = 0, rows: int = 1000,
                       sort: str = LISTING_SORT, q: str = "*:*", fl: str | None = None) -> dict[str, Any]:
        params: dict[str, Any] = {"q": q, "sort": sort, "rows": rows, "start": start}
        if self.include_private:
            params["include_private"] = "true"
        if fq:
            params["fq"] = fq
        if fl:
            params["fl"] = fl
        return params

    def _page_name(self, start: int, rows: int, fq: str | None) -> str:
        return f"{self.portal} package_search start={start} rows={rows}" + (f" fq={fq!r}" if fq else "")

    def _page_records(self, answer: _PageRead, *, fq: str | None, start: int, rows: int,
                      fl: str | None) -> Iterator[Any]:
        """The records of one listing page, read as the answer streams (``_Streamed``), ``answer``
        told its count. An answer that breaks off or turns out not to be CKAN's once records of it
        were handed on (a connection cut, a body that is not JSON past some point, no ``success:
        true``) is asked again and read whole, through the retrying path, and its records after
        those already handed on come from there (its first ones must be the same records): what
        was handed on stays, nothing is handed on twice, and a page that never reads whole fails
        with an error naming it. The guard's size cap and deadline stop the page as they are."""
        params = self._search_params(fq=fq, start=start, rows=rows, fl=fl)
        what = f"{self.portal} package_search"
        try:
            stream = self.http.get(f"{self.base_url}/api/3/action/package_search", params=params, what=what,
                                   stream=True, capped_whole=True, parse=lambda resp: self._open_page(resp, fq))
        except RetriesExhausted as exc:
            raise PortalUnavailable(f"{what}: portal unavailable after {exc.attempts} attempts (last: {exc.last})",
                                    portal=self.portal, action="package_search", status=exc.status) from None
        answer.stream = stream
        read_ids: list = []
        try:
            for rec in stream.records():
                read_ids.append(_identity(rec))
                yield rec
            if stream.success is not True:
                raise ValueError(f"the answer has no success: true (success: {stream.success!r})")
            answer.count = stream.count
            return
        except SourceError:
            raise  # (the guard's TooLarge, FetchTimeout)
        except (ValueError, RecursionError, OSError, urllib3.exceptions.HTTPError, requests.RequestException) as exc:
            reason = (str(exc) if isinstance(exc, ValueError) else "a record nested deeper than Python's json reads"
                      if isinstance(exc, RecursionError) else failure_text(exc))
        finally:
            stream.close()
        name = self._page_name(start, rows, fq)
        done = len(read_ids)
        log.warning("%s: the answer broke off after %d of its records (%s); reading the page again, whole",
                    name, done, _shorten(reason, 200))
        try:
            result = self.package_search(fq=fq, start=start, rows=rows, fl=fl)
        except CkanError as exc:
            raise type(exc)(f"{name}: the answer broke off after {done} records ({_shorten(reason, 200)}), which "
                            f"were kept; read again: {exc}", portal=self.portal, action="package_search",
                            status=exc.status, error_type=exc.error_type) from None
        page = result["results"]
        if [_identity(r) for r in page[:done]] != read_ids:
            raise PortalUnavailable(f"{name}: the answer broke off after {done} records ({_shorten(reason, 200)}), "
                                    "which were kept, and read again it no longer begins with them",
                                    portal=self.portal, action="package_search")
        answer.count = result.get("count")
        answer.stream = None
        del read_ids[:]
        yield from page[done:]

    def _open_page(self, resp: requests.Response, fq: str | None) -> "_Streamed":
        """A listing page's answer opened (``_Streamed.open``): its records not read yet. What is
        not a CKAN answer before its first record is retried (``_NotCkanAnswer``), as a page read
        whole is; an error answer (not 2xx) is read whole and judged as ``_result`` does."""
        status = resp.status_code
        if not 200 <= status < 300:
            try:
                resp.content  # noqa: B018 - (an error answer: small, read whole, capped)
            finally:
                self.http.add_bytes(wire_bytes(resp))
            return self._result("package_search", resp, fq)  # (raises)
        stream = _Streamed(self, resp)
        try:
            stream.open()
        except SourceError:
            stream.close()
            raise
        except (OSError, urllib3.exceptions.HTTPError, requests.RequestException) as exc:
            stream.close()
            raise _NotCkanAnswer(f"HTTP {status}, the answer broke off: {failure_text(exc)}") from None
        except (ValueError, RecursionError):
            pass
        else:
            if stream.has_results and stream.success is not False:
                return stream
        # Not a listing's answer, as far as it was read: read whole and judged as every answer is
        # (the same retries and messages), or, if it reads whole after all, its records from there.
        try:
            kept, stream.body.kept = b"".join(stream.body.kept or ()), None
            resp._content = kept + stream.body.raw.read()
        finally:
            stream.close()
        return _Whole(self._result("package_search", resp, fq))

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
            # The page is read as it streams, a record at a time (``_page_records``), and handed on
            # in slices of at most SLICE_BYTES of the answer: every check a record needs is made as
            # it comes (fl, fq, sort order, the overlap); those that need the whole page (the count,
            # a page repeating the one before) once it is read.
            ids: list = []  # the page's identities, in order
            n = missing = run_len = 0
            prev_key = run_key = None
            fresh: list = []
            stepped_back = False
            answer = _PageRead()
            try:
                read = self._page_records(answer, fq=fq, start=start, rows=rows, fl=fl)
                try:
                    mark = 0
                    for rec in read:
                        if fl and not isinstance(rec, dict):
                            raise CkanError(f"{self.portal} package_search: fl={fl!r} answered with something "
                                            "other than records", portal=self.portal, action="package_search")
                        key = _record_key(rec)
                        if fq is not None and (key < fq_boundary or key is _MAX_KEY):
                            raise FilterRejected(f"{self.portal} package_search: the portal ignored fq {fq!r} "
                                                 "(returned records outside it)", portal=self.portal,
                                                 action="package_search")
                        if prev_key is not None and key < prev_key:
                            raise CkanError(f"{self.portal} package_search: the portal did not honour "
                                            f"sort={LISTING_SORT!r}", portal=self.portal, action="package_search")
                        prev_key = key
                        run_key, run_len = (key, run_len + 1) if key == run_key else (key, 1)
                        ident = _identity(rec)
                        ids.append(ident)
                        n += 1
                        if key is _MAX_KEY:
                            missing += 1
                        if first and answer.count is not None:
                            self.total = answer.count if isinstance(answer.count, int) else None
                        received = boundary is not None and (key < boundary or (key == boundary and ident in seen))
                        if n == 1 and overlap and not received:
                            stepped_back = True  # (see below)
                            break
                        if received:
                            continue
                        fresh.append(rec)
                        if boundary is None or key > boundary:
                            boundary, seen = key, {ident}
                        else:
                            seen.add(ident)
                        if answer.bytes_read() - mark >= self.slice_bytes:
                            mark = answer.bytes_read()
                            yielded += len(fresh)
                            yield fresh
                            fresh = []
                finally:
                    read.close()
            except FilterRejected as exc:
                if fq is None:
                    raise
                self._fq_rejected = True  # a full listing on this client will not try fq again
                if since is not None:
                    raise
                if fresh:
                    yielded += len(fresh)
                    yield fresh  # (records of the filter's range, before the one outside it)
                log.warning("%s rejected the listing filter (%s); listing on without fq", self.portal, exc)
                use_fq, pos, last_ids = False, 0, None
                continue
            if fresh:
                yielded += len(fresh)
                yield fresh
                fresh = []
            count = answer.count
            if first:
                self.total = count if isinstance(count, int) else None
                first = False
            if stepped_back or (overlap and not n):
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
            page_ids = tuple(ids)
            if n and page_ids == last_ids:
                # (its records were all received before: none of it was handed on again)
                self.cut = (f"{self.portal} package_search: the answer at start={start} repeats the page "
                            f"before it; the listing stops there, incomplete ({yielded} records)")
                log.warning("%s", self.cut)
                break
            last_ids = page_ids
            del ids, page_ids
            if missing:
                log.warning("%s: %d record(s) without a usable metadata_modified", self.portal, missing)
            log.debug("%s package_search start=%s rows=%s fq=%s: %s records, count=%s",
                      self.portal, start, rows, fq, n, count)
            if not n:
                break
            if isinstance(count, int):
                if start + n >= count:
                    break  # CKAN's count (Solr's numFound) is exact: all were listed
            elif overlap and n == 1:
                break  # no count: nothing after the record we stood on (the empty page's equivalent)
            # No count (not CKAN's own answer): a short page is no proof of the end, since
            # ckan.search.rows_max may cut pages below ``rows`` (issue 36); an empty one is.
            if fq_for(boundary) != fq:
                # keyset step: the next result list starts with this page's records at the new
                # boundary (all seen), so go on right after them
                pos = run_len if run_key == boundary else 0
            else:
                new_pos = start + n
                if new_pos <= pos:
                    raise CkanError(f"{self.portal} package_search: listing made no progress at "
                                    f"start={start} (pages of {n} records)",
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
        """The listing's records normalized, in the slices the client reads them in (at most
        ``CkanClient.slice_bytes`` of the answer each, never more than a page)."""
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
