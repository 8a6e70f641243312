"""Web Accessible Folders of ISO 19139 / 19115-2 files (``type: iso-waf``): data.gov's ``waf`` sources.

A WAF is a web server's folder: no query, no paging, no count. Its listing is the server's own
index page (Apache ``mod_autoindex``, as a FancyIndexing table, a ``<pre>`` or a plain ``<ul>``;
nginx ``autoindex``; IIS directory browsing), read as data.gov's harvester reads it
(GSA/datagov-harvester ``traverse_waf`` / ``get_waf_datetimes``) and ckanext-spatial's WAF gather:

- every ``<a href>`` whose path ends in ``.xml`` (any case) is a file, resolved against the page's
  URL; every link ending in ``/`` a sub-folder, walked in turn (breadth first), except a parent
  (anything not strictly under the folder: ``../``, ``/``, IIS's ``[To Parent Directory]``),
  ``dcatus/`` (data.gov's own skip) and anything outside the WAF's root URL (another host, another
  path), which is never fetched;
- each row's date, in the four formats those servers write (``2026-07-12 02:23`` Apache,
  ``02-Oct-2025 11:47`` nginx after the link; ``6/17/2021 12:20 PM`` IIS, ``Friday, July 31, 2026
  4:53 PM`` IIS long, before it): server local time, no zone, minute precision; a row without one
  (Census's plain ``<ul>``) is an undated file.
- The walk is bounded: at most ``max_folders`` listings, ``max_depth`` levels, ``MAX_LISTING_BYTES``
  a listing. A folder already walked is not walked again, and a listing whose entries (names and
  dates) are those of one of its ancestors (a symbolic link looping back: ``a/loop/ -> a/``) is a
  loop and not followed (said in a warning; the files are the ancestor's, listed already). A
  sub-listing that answers 4xx, or a cut walk (a bound reached), leaves the walk incomplete: nothing
  is removed on it, and ``list_ids`` raises ``SourceError`` after its last page. A 2xx page that is
  not a directory listing (no entry, no ``Index of``, a proxy's error page) is retried like a 5xx.

Records. Each file is one dataset whose ``source_id`` is the file's URL (``fileIdentifier`` is a
UUID in braces, a file name or an InPort id: unreliable as a key; it is kept as ``file_identifier``
with ``gmd:dateStamp`` as ``date_stamp``). The mapping is the CSW source's (sources/csw.py
``iso_mapping``): title, abstract, keywords, organisation, licence, online resources, every other
value as an extra. ``metadata_modified`` is the listing's date of the file (so that reconciliation's
comparison of listed and stored dates finds exactly the files whose date changed, as
ckanext-spatial's gather does), None for an undated file. The record's declared language
(``gmd:language``: ``eng``, ``fre``, ``eng; USA``) becomes ``DatasetRecord.language`` as an ISO
639-1 code. Files are parsed with the standard library's expat after a check that refuses any DTD
or entity declaration (ISO records declare none; entities are how a small XML document expands to
gigabytes), at most ``max_file_bytes`` a file, ``MAX_ELEMENTS`` elements and ``MAX_XML_DEPTH``
levels; the declared encoding is honoured (ISO-8859-1 and the other single-byte ones expat reads
through Python's codecs), and a file without a declaration that is not UTF-8 is read in the
charset of its Content-Type, else as ISO-8859-1. A file refused so, not XML, or not an ISO record
is that record's outcome (``unsafe-xml``, ``not-iso-metadata``, ``file-too-large``), the rest goes on.

Incremental. The walk is always whole (a WAF cannot be asked for less); what is fetched is:
a dated file listed at or after ``since`` minus ``TIME_ZONE_MARGIN`` (14 hours: the listing's date
is the server's local time without a zone, and every zone is within 14 hours of UTC); an undated
file with ``If-None-Match`` / ``If-Modified-Since`` from the validators the last committed run kept
(``Listing.validators``: ``{"files": {url: {"etag", "last_modified"}}}``, undated files only, at
most ``MAX_VALIDATORS``), so an unchanged one costs a 304 and no bytes. A full listing fetches every
file. Reconciliation (``list_ids``: the walk, every file with its listed date; ``fetch_by_ids``: one
GET a file) finds the files changed without the margin seeing them and the files gone.

Resuming (``Capabilities.resumable``): a WAF is fetched one file a request, so a retried
fetch_modified of the same run gets the ids the failed attempt staged (``Listing.already_staged``)
and fetches only the others; records are handed over in pages of at most ``STAGE_PAGE`` files, and
the page in hand when a fetch fails is handed over before the error, so what was fetched is kept.

A portal URL ending in ``.xml`` is a WAF of that one file (``harvester validate`` of one ISO
document reads it so); one naming a folder's index page (``.../waf/index.html``) is that folder. A
listing that redirects (a WAF moved, to https) is walked where it leads. A listing is read whole or
asked again: its Content-Length reached, and ending with ``</html>`` as every server's index page
does (a body closed early has no other sign).
"""
from __future__ import annotations

import hashlib
import logging
import re
import time
import xml.etree.ElementTree as ET
from collections import deque
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone
from html.parser import HTMLParser
from typing import Iterator
from urllib.parse import unquote, urldefrag, urljoin, urlsplit

import requests
import urllib3

from harvester.config.portals import ISO_WAF, TEXT_SEARCH_CONFIGS
from harvester.domain.dataset import DatasetRecord, failed, package_record
from harvester.domain.outcomes import problem
from harvester.http import Retryable, conditional_headers, scrub_url, streamed_bytes, validators_of
from harvester.http.guard import FetchTimeout, TooLarge
from harvester.sources.base import Capabilities, CountsTraffic, IdPage, Listing, SourceError, to_ms
from harvester.sources.csw import NS, iso_mapping, language_tag, short
from harvester.sources.xml_chars import Forbidden
from harvester.sources.xml_chars import warning as forbidden_warning

log = logging.getLogger(__name__)

# Every time zone is within 14 hours of UTC (UTC-12 to UTC+14): a file listed at or after
# ``since`` less this, read as UTC, may have changed since ``since``.
TIME_ZONE_MARGIN = timedelta(hours=14)
MAX_FOLDERS = 10_000
MAX_DEPTH = 20
MAX_LISTING_BYTES = 64 * 1024 * 1024  # an nginx listing of 30,000 files is about 3 MB
MAX_FILE_BYTES = 32 * 1024 * 1024  # real ISO records are tens of KB; the 1,259-keyword one 164 KB
MAX_ELEMENTS = 500_000
MAX_XML_DEPTH = 100
MAX_VALIDATORS = 100_000
STAGE_PAGE = 50  # records handed to staging at a time: what a failed attempt keeps
FILE_DEADLINE = 300.0  # seconds one file may take to arrive (a drip never ends otherwise)
_ISO_ROOTS = {f"{{{NS['gmd']}}}MD_Metadata": "iso19139", f"{{{NS['gmi']}}}MI_Metadata": "iso19115-2"}
_SKIPPED_FOLDERS = ("dcatus",)
_INDEX_PAGE = re.compile(r"^(?:index|default)\.(?:html?|php|aspx?|jsp)$", re.IGNORECASE)  # a folder's named page

# -- dates of a listing ------------------------------------------------------------------------------
_MONTHS = {m: i for i, m in enumerate(("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct",
                                       "nov", "dec"), 1)}
_LONG_MONTHS = {m: i for i, m in enumerate(("january", "february", "march", "april", "may", "june", "july",
                                            "august", "september", "october", "november", "december"), 1)}
# after the link: Apache (ISO-like) and nginx / old Apache (day-month-year)
_APACHE = re.compile(r"(\d{4})-(\d{2})-(\d{2})[ T]+(\d{1,2}):(\d{2})(?::(\d{2}))?")
_NGINX = re.compile(r"(\d{1,2})-([A-Za-z]{3})-(\d{4})\s+(\d{1,2}):(\d{2})(?::(\d{2}))?")
# before the link: IIS, short and long
_IIS = re.compile(r"(\d{1,2})/(\d{1,2})/(\d{4})\s+(\d{1,2}):(\d{2})(?::\d{2})?\s*([AaPp][Mm])?")
_IIS_LONG = re.compile(r"(?:Monday|Tuesday|Wednesday|Thursday|Friday|Saturday|Sunday),\s+([A-Za-z]+)\s+(\d{1,2}),"
                       r"\s+(\d{4})\s+(\d{1,2}):(\d{2})(?::\d{2})?\s*([AaPp][Mm])?")


def _clock(hour: int, minute: int, half: str | None) -> tuple[int, int]:
    if half:
        hour = hour % 12 + (12 if half.lower() == "pm" else 0)
    return hour, minute


def _made(*parts) -> datetime | None:
    try:
        return datetime(*parts)
    except (ValueError, OverflowError):
        return None


def date_after(text: str) -> tuple[datetime | None, str]:
    """The Apache or nginx date in the text after a listing's link: (naive datetime, as written)."""
    found = [m for m in (_APACHE.search(text), _NGINX.search(text)) if m]
    if not found:
        return None, ""
    m = min(found, key=lambda m: m.start())
    if m.re is _APACHE:
        when = _made(int(m[1]), int(m[2]), int(m[3]), int(m[4]), int(m[5]))
    else:
        month = _MONTHS.get(m[2].lower())
        when = _made(int(m[3]), month, int(m[1]), int(m[4]), int(m[5])) if month else None
    return when, m[0]


def date_before(text: str) -> tuple[datetime | None, str]:
    """The IIS date (short or long) in the text before a listing's link."""
    found = [m for m in (_IIS.search(text), _IIS_LONG.search(text)) if m]
    if not found:
        return None, ""
    m = max(found, key=lambda m: m.start())
    if m.re is _IIS:
        hour, minute = _clock(int(m[4]), int(m[5]), m[6])
        when = _made(int(m[3]), int(m[1]), int(m[2]), hour, minute)
    else:
        month = _LONG_MONTHS.get(m[1].lower())
        hour, minute = _clock(int(m[4]), int(m[5]), m[6])
        when = _made(int(m[3]), month, int(m[2]), hour, minute) if month else None
    return when, m[0]


# -- a listing page ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class WafFile:
    """A file of the WAF: its URL and its listed date (naive: the server's local time; None when
    the listing gives none)."""

    url: str
    modified: datetime | None = None

    @property
    def modified_utc(self) -> datetime | None:
        """The listed date read as UTC (what is stored and compared; the zone is unknown)."""
        return self.modified.replace(tzinfo=timezone.utc) if self.modified else None


@dataclass
class ListingPage:
    url: str
    files: list[WafFile]
    folders: list[str]
    fingerprint: str
    recognized: bool


class _Links(HTMLParser):
    """The links of an HTML page in order, each with the text before it (since the previous link)
    and after it (to the next link), and whether the page says it is a directory listing."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.links: list[list] = []  # [href, text before, text after]
        self._between: list[str] = []
        self._in_link = False
        self.heading = []

    def handle_starttag(self, tag, attrs):
        if tag == "a":
            href = dict(attrs).get("href")
            before = "".join(self._between)
            if self.links:
                self.links[-1][2] = before
            self.links.append([href, before, ""])
            self._between = []
            self._in_link = True
        elif tag in ("br", "tr", "li", "td", "p"):
            self._between.append(" ")

    def handle_endtag(self, tag):
        if tag == "a":
            self._in_link = False
            self._between = []

    def handle_data(self, data):
        if not self._in_link:
            self._between.append(data)
        if len(self.heading) < 50:
            self.heading.append(data)

    def close(self):
        super().close()
        if self.links:
            self.links[-1][2] = "".join(self._between)


def _under(url: str, folder: str) -> bool:
    """``url`` is strictly inside ``folder`` (same scheme, host and port; a longer path)."""
    a, b = urlsplit(url), urlsplit(folder)
    return (a.scheme, a.netloc.lower()) == (b.scheme, b.netloc.lower()) and a.path.startswith(b.path) \
        and len(a.path) > len(b.path)


def parse_listing(html: str, page_url: str, root: str) -> ListingPage:
    """A directory listing's files and sub-folders (module docstring), resolved against
    ``page_url``, only those under ``root``."""
    folder = page_url if page_url.endswith("/") else page_url.rsplit("/", 1)[0] + "/"  # (.../index.html)
    parser = _Links()
    parser.feed(html)
    parser.close()
    files: dict[str, WafFile] = {}
    folders: dict[str, None] = {}
    entries = []
    for href, before, after in parser.links:
        if not href:
            continue
        href = href.strip()
        url = urldefrag(urljoin(page_url, href))[0]
        path = unquote(urlsplit(url).path)
        if urlsplit(url).query:
            continue  # the column sort links (?C=N;O=D)
        if path.lower().endswith(".xml"):
            if not _under(url, root) and url != root:
                continue
            when, written = date_after(after)
            if when is None:
                when, written = date_before(before)
            files.setdefault(url, WafFile(url, when))
            entries.append((path.rsplit("/", 1)[-1], written))
        elif path.endswith("/"):
            name = path.rstrip("/").rsplit("/", 1)[-1]
            entries.append((name + "/", date_after(after)[1] or date_before(before)[1]))
            if not _under(url, folder) or not _under(url, root):
                continue  # a parent, the root, another site
            if name.lower() in _SKIPPED_FOLDERS:
                continue
            folders.setdefault(url, None)
    head = " ".join(parser.heading).lower()
    recognized = bool(files or folders) or "index of" in head or "parent directory" in head \
        or urlsplit(page_url).path.lower() in head
    fingerprint = hashlib.sha256(repr(sorted(entries)).encode()).hexdigest()
    return ListingPage(page_url, list(files.values()), list(folders), fingerprint, recognized)


# -- ISO files -------------------------------------------------------------------------------------------
class Refused(ValueError):
    """A file that cannot be read as an ISO record: ``code`` (domain/outcomes.py) and why."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


_BOMS = ((b"\xef\xbb\xbf", "utf-8"), (b"\xff\xfe\x00\x00", "utf-32-le"), (b"\x00\x00\xfe\xff", "utf-32-be"),
         (b"\xff\xfe", "utf-16-le"), (b"\xfe\xff", "utf-16-be"))
_DECLARED = re.compile(rb"^\s*<\?xml[^>]*encoding\s*=\s*[\"']([A-Za-z0-9._-]+)[\"']")


def _charset(content_type: str | None) -> str | None:
    m = re.search(r"charset\s*=\s*\"?([A-Za-z0-9._-]+)", content_type or "")
    return m.group(1) if m else None


def read_iso(body: bytes, content_type: str | None = None) -> ET.Element:
    """The root element of an ISO 19139 / 19115-2 file (``Refused`` otherwise; module docstring)."""
    text_view = body
    for bom, codec in _BOMS:
        if body.startswith(bom) and codec != "utf-8":
            text_view = body.decode(codec, "replace").encode("utf-8")
            break
    if b"\x00" in body[:4] and text_view is body:
        text_view = body.decode("utf-16", "replace").encode("utf-8")
    if b"<!DOCTYPE" in text_view or b"<!ENTITY" in text_view:
        raise Refused("unsafe-xml", "the file declares a DTD (<!DOCTYPE or <!ENTITY): refused, as no ISO 19139 "
                                    "record declares one and entities are how an XML bomb expands")
    try:
        root = ET.fromstring(body)
    except ET.ParseError as exc:
        if _DECLARED.match(body) or text_view is not body:
            raise Refused("not-iso-metadata", f"the file is not well-formed XML ({exc})") from None
        try:
            body.decode("utf-8")
            raise Refused("not-iso-metadata", f"the file is not well-formed XML ({exc})") from None
        except UnicodeDecodeError:
            pass
        # no declared encoding and not UTF-8: the HTTP charset, else ISO-8859-1
        codec = _charset(content_type) or "iso-8859-1"
        try:
            root = ET.fromstring(body.decode(codec, "replace"))
        except (ET.ParseError, LookupError) as again:
            raise Refused("not-iso-metadata", f"the file is not well-formed XML ({again})") from None
    if root.tag not in _ISO_ROOTS:
        raise Refused("not-iso-metadata", f"the root element is {short(root.tag)}, not gmd:MD_Metadata (ISO 19139) "
                                          "or gmi:MI_Metadata (ISO 19115-2)")
    count = 0
    stack = [(root, 1)]
    while stack:
        element, depth = stack.pop()
        count += 1
        if count > MAX_ELEMENTS:
            raise Refused("unsafe-xml", f"the file has more than {MAX_ELEMENTS:,} elements: refused")
        if depth > MAX_XML_DEPTH:
            raise Refused("unsafe-xml", f"the file nests elements more than {MAX_XML_DEPTH} levels deep: refused "
                                        "(ISO records have about 25)")
        stack.extend((child, depth + 1) for child in element)
    return root


def declared_language(code: str | None) -> str | None:
    """A record's ``gmd:language`` (``eng``, ``fre``, ``eng; USA``, ``en``, ``English``) as an ISO
    639-1 code, or a text-search configuration's name; None when neither."""
    m = re.match(r"[a-z]+", (code or "").strip().lstrip("#").lower())
    if not m:
        return None
    tag = language_tag(m.group(0))
    if len(tag) == 2 or tag in TEXT_SEARCH_CONFIGS and tag != "simple":
        return tag
    return None


def waf_record(root: ET.Element, file: WafFile, language: str | None = None) -> DatasetRecord:
    """One ISO file of the WAF as a record keyed by its URL (failed without a title)."""
    mapped = iso_mapping(root, language)
    if not mapped.title:
        return failed(file.url, {"id": file.url, "file_identifier": mapped.file_id or None}, [problem(
            "no-title", f"ISO file {file.url} has no title (gmd:identificationInfo/*/gmd:citation/*/gmd:title)",
            "gmd:identificationInfo/*/gmd:citation/*/gmd:title")])
    package = mapped.package
    package["id"] = file.url
    package["url"] = file.url
    package["file_identifier"] = mapped.file_id or None
    package["date_stamp"] = package.get("metadata_modified")
    package["metadata_modified"] = file.modified.isoformat() if file.modified else None
    package["schema"] = _ISO_ROOTS[root.tag]
    return package_record(package, source_id=file.url, url=file.url, title=mapped.title,
                          description=mapped.description, tags=mapped.tags, organization=mapped.organization,
                          language=declared_language(mapped.language))


# -- the source ------------------------------------------------------------------------------------------
_NOT_MODIFIED, _GONE = "not-modified", "gone"


class IsoWafSource(CountsTraffic):
    """The WAF at ``url`` (a folder; or one ``.xml`` file) through ``fetcher`` (``http.HttpFetcher``).
    ``portal``: the Portal (its name in messages, its ``language_code`` picks translations)."""

    kind = ISO_WAF
    capabilities = Capabilities(incremental=True, conditional=True, reconcile=True, resumable=True)

    def __init__(self, url: str, *, fetcher, portal=None, language: str | None = None,
                 max_folders: int = MAX_FOLDERS, max_depth: int = MAX_DEPTH, max_file_bytes: int = MAX_FILE_BYTES,
                 file_deadline: float = FILE_DEADLINE):
        self.fetcher = fetcher
        self.single = unquote(urlsplit(url).path).lower().endswith(".xml")
        # the folder; its listing is ``start`` (itself, or a named index page: ``.../waf/index.html``)
        last = urlsplit(url).path.rsplit("/", 1)[-1]
        page = not self.single and _INDEX_PAGE.match(last) is not None
        self.url = url if self.single or url.endswith("/") else url.rsplit("/", 1)[0] + "/" if page else url + "/"
        self.start = url if page else self.url
        name = getattr(portal, "name", portal)
        self.label = f"portal {name} ({scrub_url(self.url)})" if name else scrub_url(self.url)
        self.language = language if language is not None else getattr(portal, "language_code", None)
        self.max_folders, self.max_depth = max_folders, max_depth
        self.max_file_bytes, self.file_deadline = max_file_bytes, file_deadline
        self.total: int | None = None
        self.complete = False
        self.folders_read = 0
        self.listed: dict[str, WafFile] = {}  # the last walk's files (fetch_by_ids dates its records with it)
        self.fetched = self.not_modified = self.skipped = 0

    def __repr__(self) -> str:
        return f"IsoWafSource({scrub_url(self.url)!r})"

    # -- reading answers
    def _read(self, resp, cap: int, what: str, deadline: float | None = None) -> bytes:
        """A streamed answer's body, at most ``cap`` bytes (``TooLarge`` past it), within
        ``deadline`` seconds (``FetchTimeout`` past it; None: the fetcher's own deadline)."""
        raw = resp.raw
        read1 = getattr(raw, "read1", None)
        # (read1: what has arrived, so that a drip meets the deadline; decoded: a server may gzip)
        read = (lambda n: read1(n, decode_content=True)) if read1 is not None else raw.read
        ends = time.monotonic() + deadline if deadline is not None else float("inf")
        parts, size = [], 0
        try:
            while True:
                try:
                    chunk = read(64 * 1024)
                except (TooLarge, FetchTimeout):
                    raise
                except (urllib3.exceptions.HTTPError, requests.RequestException, OSError) as exc:
                    raise Retryable(f"{what}: the body was cut ({type(exc).__name__})") from None
                if not chunk:
                    break
                size += len(chunk)
                if size > cap:
                    raise TooLarge(f"{what}: larger than {cap:,} bytes: refused", cap)
                parts.append(chunk)
                if time.monotonic() > ends:
                    raise FetchTimeout(f"{what}: still arriving after {self.file_deadline:g} s: refused")
        finally:
            self.fetcher.add_bytes(streamed_bytes(raw) or size)
            resp.close()
        return b"".join(parts)

    def _listing(self, url: str, top: bool) -> ListingPage | None:
        """One folder's listing; None (with a warning) when the server refuses it (4xx)."""
        shown = f"{self.label}: the listing {scrub_url(url)}"

        def parse(resp):
            if resp.status_code >= 300:
                resp.close()
                if top:
                    raise SourceError(f"{shown}: HTTP {resp.status_code}")
                log.warning("%s: HTTP %s; the walk is incomplete (nothing is removed on it)", shown,
                            resp.status_code)
                return None
            body = self._read(resp, MAX_LISTING_BYTES, shown)
            html = body.decode(_charset(resp.headers.get("Content-Type")) or "utf-8", "replace")
            final = resp.url or url
            if top and final != self.start:
                # the WAF's own URL redirects (to https, to its trailing slash): the folder is where
                # it led, else every file would be outside it
                log.warning("%s: the WAF's URL redirects to %s; walked there", self.label, scrub_url(final))
                self.url = final if final.endswith("/") else final.rsplit("/", 1)[0] + "/"
            tail = html[-1024:].lower()
            if "</html" not in tail and "</body" not in tail:
                # every server's index page ends so; a body closed early (no Content-Length to tell)
                # would be taken for the folder, less what it lost
                raise Retryable(f"{shown}: the listing was cut short (it does not end with </html>)")
            page = parse_listing(html, final, self.url)
            if not page.recognized:
                start = " ".join(html[:120].split())
                raise Retryable(f"{shown}: the answer is not a directory listing (no file, no folder, no "
                                f"'Index of'; it begins {start!r})")
            return page

        return self.fetcher.get(url, headers={"Accept": "text/html, */*"}, stream=True, parse=parse,
                                what=f"{shown}: GET")

    def walk(self) -> Iterator[ListingPage]:
        """The WAF's listings, breadth first (module docstring); ``complete`` once it ended whole."""
        self.complete, self.folders_read, self.listed = False, 0, {}
        if self.single:
            page = ListingPage(self.url, [WafFile(self.url)], [], "", True)
            self.listed[self.url] = page.files[0]
            self.complete = True
            yield page
            return
        cut = False
        queue = deque([(self.start, ())])
        seen = {self.start, self.url}
        while queue:
            url, ancestors = queue.popleft()
            if self.folders_read >= self.max_folders:
                log.warning("%s: more than %d folders; the walk stopped before %s (incomplete: nothing is removed)",
                            self.label, self.max_folders, scrub_url(url))
                cut = True
                break
            page = self._listing(url, top=not ancestors)
            self.folders_read += 1
            if page is None:
                cut = True
                continue
            if page.fingerprint in ancestors:
                log.warning("%s: the listing %s repeats the listing of a folder above it (a link looping back); "
                            "not followed", self.label, scrub_url(url))
                continue
            fresh = [f for f in page.files if f.url not in self.listed]
            for f in fresh:
                self.listed[f.url] = f
            page.files = fresh
            yield page
            for sub in page.folders:
                if sub in seen:
                    continue
                seen.add(sub)
                if len(ancestors) + 1 > self.max_depth:
                    log.warning("%s: %s is more than %d folders deep; not walked (incomplete: nothing is removed)",
                                self.label, scrub_url(sub), self.max_depth)
                    cut = True
                    continue
                queue.append((sub, ancestors + (page.fingerprint,)))
        self.total = len(self.listed)
        self.complete = not cut

    # -- files
    def _fetch(self, file: WafFile, headers: dict | None = None):
        """(the file's record, or _NOT_MODIFIED / _GONE, and its validators {etag, last_modified})."""
        shown = f"{self.label}: the file {scrub_url(file.url)}"

        def parse(resp):
            status = resp.status_code
            if status == 304:
                resp.close()
                return _NOT_MODIFIED, {}
            if status in (404, 410):
                resp.close()
                return _GONE, {}
            validators = validators_of(resp.headers)
            if status >= 300:
                resp.close()
                return self._refused(file, "invalid-record", f"{shown}: HTTP {status}"), {}
            try:
                body = self._read(resp, self.max_file_bytes, shown, self.file_deadline)
            except (TooLarge, FetchTimeout) as exc:
                return self._refused(file, "file-too-large", str(exc)), {}
            forbidden = Forbidden()
            try:
                try:
                    root = read_iso(body, resp.headers.get("Content-Type"))
                except Refused as exc:
                    # a character XML 1.0 forbids (&#x1;, a raw 0x1A) makes the file not well-formed: read it
                    # with each one as U+FFFD, warned (sources/xml_chars.py)
                    scrubbed = forbidden.scrub(body) if exc.code == "not-iso-metadata" else None
                    if scrubbed is None:
                        raise
                    root = read_iso(scrubbed, resp.headers.get("Content-Type"))
            except Refused as exc:
                return self._refused(file, exc.code, f"{shown}: {exc}"), {}
            found = forbidden.restore_element(root)
            record = waf_record(root, file, self.language)
            if found and record.ok:
                record = replace(record, problems=record.problems + (forbidden_warning(file.url, found),))
            return record, validators

        return self.fetcher.get(file.url, headers={"Accept": "application/xml, text/xml, */*", **(headers or {})},
                                stream=True, parse=parse, what=f"{shown}: GET")

    @staticmethod
    def _refused(file: WafFile, code: str, message: str) -> DatasetRecord:
        return failed(file.url, {"id": file.url}, [problem(code, message)])

    def iter_records(self, since: datetime | None = None, page_size: int | None = None,
                     listing: Listing | None = None, validators: dict | None = None) -> Iterator[list[DatasetRecord]]:
        """``base.Source``: every file (``since`` None), or those listed at or after ``since`` less
        TIME_ZONE_MARGIN and the undated ones changed since ``validators`` (module docstring)."""
        listing = listing if listing is not None else Listing()
        size = max(1, min(int(page_size or STAGE_PAGE), STAGE_PAGE))
        skip = listing.already_staged
        known = dict((validators or {}).get("files") or {}) if isinstance(validators, dict) else {}
        kept: dict[str, dict] = {}
        cutoff = since - TIME_ZONE_MARGIN if since is not None else None
        if cutoff is not None and cutoff.tzinfo is None:
            cutoff = cutoff.replace(tzinfo=timezone.utc)
        page: list[DatasetRecord] = []
        self.fetched = self.not_modified = self.skipped = 0
        for folder in self.walk():
            for file in folder.files:
                if file.url in skip:
                    self.skipped += 1
                    if file.url in known:
                        kept[file.url] = known[file.url]
                    continue
                headers = {}
                if file.modified is None:
                    headers = conditional_headers(known.get(file.url))
                elif cutoff is not None and file.modified_utc < cutoff:
                    continue
                try:
                    got, file_validators = self._fetch(file, headers)
                except SourceError:
                    if page:  # what was fetched is staged before the failure ends the listing
                        yield page
                        page = []
                    raise
                if got is _NOT_MODIFIED:
                    self.not_modified += 1
                    if file.url in known:
                        kept[file.url] = known[file.url]
                    continue
                if got is _GONE:
                    continue
                self.fetched += 1
                if file.modified is None and file_validators and len(kept) < MAX_VALIDATORS:
                    kept[file.url] = file_validators
                page.append(got)
                if len(page) >= size:
                    yield page
                    page = []
        if page:
            yield page
        listing.complete = self.complete and since is None
        if kept:
            listing.validators = {"files": kept}
        log.info("%s: %d folders walked (%s), %d files listed, %d fetched, %d unchanged (304)%s", self.label,
                 self.folders_read, "complete" if self.complete else "INCOMPLETE", len(self.listed), self.fetched,
                 self.not_modified, f", {self.skipped} staged by an earlier attempt" if self.skipped else "")

    # -- reconciliation (sources/base.py)
    def count(self) -> int | None:
        """None: a WAF has no count (only a walk of every folder would say, which list_ids is)."""
        return None

    def list_ids(self, page_size: int) -> Iterator[IdPage]:
        """Every file's URL with its listed date (as the records carry it), a page a listing;
        ``SourceError`` after the last page when the walk was not complete."""
        for page in self.walk():
            yield IdPage([(f.url, to_ms(f.modified_utc) if f.modified else None) for f in page.files])
        if not self.complete:
            raise SourceError(f"{self.label}: the walk of the folders was incomplete ({self.folders_read} listings "
                              "read, see the warnings above); an incomplete listing cannot be reconciled with")

    def fetch_by_ids(self, ids: list[str], per_request: int = 100) -> Iterator[list[DatasetRecord]]:
        """The files of ``ids`` (their URLs), one GET each, dated by the last walk; a file gone is
        left out, an id outside the WAF is never fetched."""
        page: list[DatasetRecord] = []
        size = max(1, min(per_request, STAGE_PAGE))
        for url in ids:
            if url != self.url and not _under(url, self.url):
                log.warning("%s: %s is not in the WAF; not fetched", self.label, scrub_url(url))
                continue
            try:
                got, _ = self._fetch(self.listed.get(url) or WafFile(url))
            except SourceError:
                if page:
                    yield page
                    page = []
                raise
            if isinstance(got, DatasetRecord):
                page.append(got)
                if len(page) >= size:
                    yield page
                    page = []
        if page:
            yield page
