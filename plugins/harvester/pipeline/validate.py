"""Validate a catalogue without harvesting it: the grouped report a harvest would write, and
nothing written anywhere (no database connection at all).

Whatever the document is (a local file, an uploaded one, a URL), its records are read by the
kind's own source, reached through ``harvester.sources.source_for`` like every run reaches it (the
pipeline imports no concrete source): a local or uploaded document is served to the source by a
transport adapter of its HTTP session (``_DocumentAdapter``), so the source parses it exactly as
it parses a portal's answer. A CKAN file (a ``package_search`` / ``package_show`` answer, or
packages one a line) has no request to answer: its packages go through ``domain.dataset.normalize``,
which is the CKAN source's parsing. The records' problems (``DatasetRecord.reported()``) become
rows numbered as a harvest numbers them (``position`` = place in the listing + 1, ``ordinal`` the
problem's index), the rows of a harvest's first run: a Failed record's problems, a stored record's
warnings; ``domain.outcomes.group`` groups them as ``store.outcomes.groups`` groups a run's rows.

Fetching (``FetchPolicy``, harvester.http.guard): every request of a validation goes through one
guarded ``requests`` session (address policy at connect time, a size cap and one deadline for the
whole validation, enforced as bytes arrive; an uploaded document too: a gzip bomb is cut by the
time it takes, as its compressed bytes are read).

The command line validates with ``FetchPolicy()`` (private addresses allowed, no size limit, no
deadline: an operator may validate an intranet portal, or a catalogue of GBs, from their own
shell); the API with ``FetchPolicy.from_settings()``.
"""
from __future__ import annotations

import io
import logging
import re
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Iterable, Iterator
from urllib.parse import quote, urlsplit

import requests
from requests.adapters import BaseAdapter

from harvester.config.portals import CKAN, DCAT_JSON, DCAT_RDF, STAC, VALIDATE_TYPES, Portal
from harvester.domain import outcomes as oc
from harvester.domain.dataset import DatasetRecord, normalize
from harvester.config.secrets import redact_url
from harvester.http.guard import FetchPolicy, FetchTimeout, Refused, TooLarge, failure_text, size_text
from harvester.sources import Listing, SourceError, json_loads, source_for
from harvester.sources.base import SourceUnavailable

log = logging.getLogger(__name__)

KINDS = VALIDATE_TYPES
ROW_FIELDS = ("position", "source_id", "ordinal", "stage", "severity", "code", "field", "value", "message")
PAGE_SIZE = 1000  # records a page (CKAN: rows of a package_search), as portals.yaml's default
# Rows a validation keeps (the first ones, in listing order); the counts and groups stay exact
# past it. A 5 MB data.json of broken entries has 1.5 M rows, 600 MB as dicts: 10,000 are ~10 MB.
MAX_ROWS = 10_000
SNIFF_BYTES = 64 * 1024  # what kind guessing reads of a document
# Media types of an RDF document (what the dcat-rdf source reads).
_RDF_TYPES = frozenset({"application/rdf+xml", "text/turtle", "application/x-turtle", "text/n3",
                        "application/n-triples", "application/ld+json"})
_RDF_SUFFIXES = (".rdf", ".ttl", ".n3", ".nt", ".owl", ".jsonld", ".xml")
_JSON_KEY = r'"{}"\s*:'


# -- the report --------------------------------------------------------------------------------------
@dataclass
class Report:
    """What validating ``source`` found: ``records`` read, ``failed`` (not stored by a harvest),
    ``warned`` (stored with warnings), ``groups`` (``Group.as_dict()``, in ``group_order``, counting
    every row) and the first ``rows`` (at most the ``max_rows`` of ``report_of``); ``rows_total``:
    how many rows there are in all. ``guessed``: how the kind was told when it was not given (None:
    given). ``complete``: False when the listing was cut (the CKAN pages asked for, a local RDF page
    linking the next)."""

    source: str
    kind: str
    records: int
    failed: int
    warned: int
    groups: list[dict]
    rows: list[dict]
    guessed: str | None = None
    complete: bool = True
    rows_total: int | None = None  # None: len(rows)

    def __post_init__(self):
        if self.rows_total is None:
            self.rows_total = len(self.rows)

    def as_dict(self, *, rows: int | None = None) -> dict:
        """The report as JSON; ``rows``: at most this many rows (all kept when None), ``rows_total``
        says how many there are."""
        return {"source": self.source, "kind": self.kind, "guessed": self.guessed, "complete": self.complete,
                "records": self.records, "failed": self.failed, "warned": self.warned, "groups": self.groups,
                "rows": self.rows if rows is None else self.rows[:rows], "rows_total": self.rows_total}


def report_of(source: str, kind: str, pages: Iterable[list[DatasetRecord]], *, guessed: str | None = None,
              complete: bool | None = None, listing: Listing | None = None, max_rows: int | None = MAX_ROWS) -> Report:
    """The report of the records of ``pages`` in listing order: the rows a harvest's first run writes
    (all problems of a Failed record, the warnings of a stored one), the first ``max_rows`` of them
    kept (None: all); groups and counts are of every row, counted as they come."""
    rows: list[dict] = []
    grouping = oc.Grouping()
    records = failed = warned = total = 0
    for page in pages:
        for record in page:
            if record.deleted:
                continue  # the portal's word that a record is gone (OAI-PMH): no record to judge
            records += 1
            problems = record.reported()
            if not record.ok:
                failed += 1
            elif any(p.severity == oc.WARNING for p in problems):
                warned += 1
            for ordinal, item in enumerate(problems):
                if record.ok and item.severity != oc.WARNING:
                    continue
                row = {"position": records, "source_id": record.source_id, "ordinal": ordinal,
                       "stage": item.stage, "severity": item.severity, "code": item.code, "field": item.field,
                       "value": item.value, "message": item.message}
                grouping.add(row)
                total += 1
                if max_rows is None or len(rows) < max_rows:
                    rows.append(row)
    if complete is None:
        complete = listing.complete if listing is not None else True
    return Report(source, kind, records, failed, warned, [g.as_dict() for g in grouping.groups()], rows, guessed,
                  complete, total)



class _DocumentBody:
    """The body of a served document (``url``): ``fp`` read from its start, in chunks, as a streamed
    answer's ``raw`` is read (``read``, ``stream``, ``tell``), until the ``deadline``; closing it
    leaves ``fp`` to its owner."""

    decode_content = False  # (a source may set it: the document is served as it is)

    def __init__(self, fp: IO[bytes], deadline: float = float("inf"), url: str = "the document"):
        self._fp, self._read, self.closed, self._deadline, self._url = fp, 0, False, deadline, url

    def read(self, amt: int | None = None, *args, **kwargs) -> bytes:
        if time.monotonic() > self._deadline:
            raise FetchTimeout(f"{self._url}: still reading and parsing it after the validation's time "
                               "(HARVESTER_VALIDATE_TIMEOUT_SECS) ran out")
        data = b"" if self.closed else self._fp.read(-1 if amt is None else amt)
        self._read += len(data)
        return data

    def stream(self, amt: int | None = 2 ** 16, decode_content=None) -> Iterator[bytes]:
        while True:
            chunk = self.read(amt or 64 * 1024)
            if not chunk:
                return
            yield chunk

    def tell(self) -> int:
        return self._read

    def close(self) -> None:
        self.closed = True

    def release_conn(self) -> None:
        pass


class _DocumentAdapter(BaseAdapter):
    """Serves one document (``fp``, seekable) at one URL, as a portal would: what lets a source read
    a local or uploaded document through its own HTTP path. Any other URL of the scheme: 404."""

    def __init__(self, url: str, fp: IO[bytes], content_type: str | None, deadline: float = float("inf")):
        super().__init__()
        self.url, self.fp, self.content_type, self.deadline = url, fp, content_type, deadline

    def send(self, request, stream=False, timeout=None, verify=True, cert=None, proxies=None):
        response = requests.Response()
        response.request, response.url = request, request.url
        if request.url != self.url:
            response.status_code, response.reason = 404, "Not Found"
            response.raw = _DocumentBody(io.BytesIO(b"only the document being validated is served"))
            return response
        self.fp.seek(0)
        response.status_code, response.reason = 200, "OK"
        if self.content_type:
            response.headers["Content-Type"] = self.content_type
        response.raw = _DocumentBody(self.fp, self.deadline, self.url)
        return response

    def close(self) -> None:
        pass


# -- kinds ---------------------------------------------------------------------------------------
def _has_key(text: str, key: str) -> bool:
    return re.search(_JSON_KEY.format(re.escape(key)), text) is not None


def sniff(head: bytes, content_type: str | None = None) -> str | None:
    """The kind the start of a document (and its media type) looks like; None: cannot tell."""
    media = (content_type or "").split(";")[0].strip().lower()
    if head.startswith(b"\x1f\x8b"):  # gzip: only a data.json is read gzipped
        try:
            head = zlib.decompressobj(wbits=31).decompress(head, SNIFF_BYTES)
        except zlib.error:
            return DCAT_JSON
    text = head.decode("utf-8", "replace").lstrip("\ufeff \t\r\n")
    if media in _RDF_TYPES:
        return DCAT_RDF
    if text.startswith(("{", "[")):
        if _has_key(text, "success") and (_has_key(text, "result") or _has_key(text, "help")):
            return CKAN
        if _has_key(text, "@graph") or "http://www.w3.org/ns/dcat#" in text:
            return DCAT_RDF
        if _has_key(text, "stac_version"):  # a STAC landing page, catalog, collection or /collections page
            return STAC
        if _has_key(text, "dataset"):
            return DCAT_JSON
        if _has_key(text, "metadata_modified") or _has_key(text, "num_resources"):
            return CKAN
        if _has_key(text, "@context") and not _has_key(text, "identifier"):
            return DCAT_RDF
        return DCAT_JSON if text.startswith("[") and _has_key(text, "identifier") else None
    if text.startswith(("<", "@prefix", "@base", "PREFIX", "prefix", "BASE", "#")):
        return DCAT_RDF
    return None


def kind_of_name(name: str) -> str | None:
    """The kind a file name or URL says (``.jsonld``, ``.ttl``... RDF; ``.jsonl`` CKAN; a CKAN Action
    API URL); None when it does not say (``.json`` may be anything)."""
    path = urlsplit(name).path.lower() if "://" in name else name.lower()
    if path.endswith(".gz"):
        path = path[:-3]
    if path.endswith(_RDF_SUFFIXES):
        return DCAT_RDF
    if path.endswith((".jsonl", ".ndjson")) or "/api/3/action/" in path or path.endswith("/api/3/action"):
        return CKAN
    return None


def _check_kind(kind: str | None) -> None:
    if kind is not None and kind not in KINDS:
        raise ValueError(f"type {kind!r} cannot be validated; the types are {', '.join(KINDS)}")


def _guess(name: str, head: bytes, content_type: str | None) -> tuple[str, str]:
    """(kind, how it was told). Undecided: a JSON document is taken for a data.json and markup for
    RDF, so that the source says what is wrong with it."""
    by_name = kind_of_name(name)
    if by_name:
        return by_name, "the name"
    sniffed = sniff(head, content_type)
    if sniffed:
        return sniffed, "the content"
    return DCAT_JSON, "nothing (taken for a data.json)"


# -- reading documents -----------------------------------------------------------------------------------
def _portal(url: str, kind: str, policy: FetchPolicy) -> Portal:
    return Portal(name="validate", url=url, type=kind, politeness_delay=0.0, max_retries=policy.max_retries,
                  timeout=policy.timeout)


def _source(url: str, kind: str, policy: FetchPolicy, session: requests.Session):
    """The kind's own source (``source_for``, as a run gets it) reading through ``session``."""
    return source_for(_portal(url, kind, policy), session=session, backoff=0.5, max_backoff=2.0)


def _listed(source, *, pages: int | None = None,
            page_size: int = PAGE_SIZE) -> tuple[Iterator[list[DatasetRecord]], Listing]:
    """The source's whole listing (``since`` None), at most ``pages`` pages."""
    listing = Listing()

    def generate() -> Iterator[list[DatasetRecord]]:
        for n, page in enumerate(source.iter_records(None, page_size, listing), 1):
            yield page
            if pages is not None and n >= pages:
                listing.complete = False
                return
    return generate(), listing


def _ckan_packages(data: bytes, name: str, limit: int | None = None) -> list:
    """The packages of a CKAN document: a package_search answer (or its result), a package_show
    answer, a package, a list of packages, or packages one a line; plain or gzipped."""
    if data.startswith(b"\x1f\x8b"):  # unpacked to at most ``limit`` bytes
        unpacker = zlib.decompressobj(wbits=31)
        try:
            data = unpacker.decompress(data, 0 if limit is None else limit + 1)
        except zlib.error as exc:
            raise SourceError(f"{name}: the gzip stream is corrupt ({exc})") from None
        if limit is not None and len(data) > limit:
            raise TooLarge(f"{name}: the document unpacks to more than {size_text(limit)} "
                           "(HARVESTER_VALIDATE_MAX_BYTES)", limit)
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise SourceError(f"{name}: not UTF-8 text ({exc}): neither a CKAN answer nor packages") from None
    try:
        document: Any = json_loads(text)  # (any depth: a package too deep is its record's error)
    except ValueError as exc:
        lines = [line for line in text.splitlines() if line.strip()]
        if len(lines) < 2:
            raise SourceError(f"{name}: not a JSON document ({exc})") from None
        packages = []
        for n, line in enumerate(lines, 1):
            try:
                packages.append(json_loads(line))
            except ValueError as line_exc:
                raise SourceError(f"{name}: line {n} is not JSON ({line_exc}): neither a CKAN answer nor "
                                  "packages one a line") from None
        return packages
    if isinstance(document, list):
        return document
    if isinstance(document, dict) and "success" in document:
        if document.get("success") is not True:
            raise SourceError(f"{name}: a CKAN answer with success: {document.get('success')!r}"
                              f" ({str(document.get('error'))[:200]})")
        result = document.get("result")
        if isinstance(result, dict) and isinstance(result.get("results"), list):
            return result["results"]
        return [result]
    if isinstance(document, dict) and isinstance(document.get("results"), list):
        return document["results"]
    if isinstance(document, dict) and {"id", "name", "metadata_modified", "resources"} & set(document):
        return [document]
    raise SourceError(f"{name}: not a CKAN package_search or package_show answer, nor CKAN packages")


def validate_file(fp: IO[bytes], kind: str | None, source_name: str, *, content_type: str | None = None,
                  fetcher: FetchPolicy | None = None, max_rows: int | None = MAX_ROWS) -> Report:
    """Validate the document ``fp`` (binary, seekable) named ``source_name`` (a URL, or a name it is
    known by: its suffix may tell the kind and the RDF format). ``kind`` None: guessed. ``max_rows``:
    the rows kept (``report_of``)."""
    _check_kind(kind)
    policy = fetcher or FetchPolicy()
    guessed = None
    if kind is None:
        fp.seek(0)
        kind, how = _guess(source_name, fp.read(SNIFF_BYTES), content_type)
        guessed = f"{kind}, from {how}"
    fp.seek(0)
    if kind == CKAN:
        packages = _ckan_packages(fp.read(), source_name, policy.max_bytes)
        # one record at a time: a page of every record of a large file would hold them all
        records = ([normalize(pkg, source_name)] for pkg in packages)
        return report_of(source_name, kind, records, guessed=guessed, max_rows=max_rows)
    url = source_name if "://" in source_name else "upload:///" + quote(source_name.lstrip("/"))
    session = policy.session()  # remote JSON-LD contexts are fetched (guarded) like any page
    session.mount(url, _DocumentAdapter(url, fp, content_type, session.ends_at))  # type: ignore[attr-defined]
    source = _source(url, kind, policy, session)
    if hasattr(source, "max_pages"):
        source.max_pages = 1  # a document's next page (Hydra) is not part of the document
    pages, listing = _listed(source)
    try:
        return report_of(source_name, kind, pages, guessed=guessed, listing=listing, max_rows=max_rows)
    except requests.RequestException as exc:
        raise fetch_failed(source_name, exc) from exc
    finally:
        session.close()


def validate_path(path: str | Path, kind: str | None = None, *, fetcher: FetchPolicy | None = None,
                  max_rows: int | None = MAX_ROWS) -> Report:
    """Validate a local file (dcat-json plain or gzipped, any RDF serialization dcat-rdf reads, a
    CKAN answer or packages one a line); its URL (``file://``) names it in the report."""
    path = Path(path).resolve()
    with path.open("rb") as fp:
        return validate_file(fp, kind, path.as_uri(), fetcher=fetcher, max_rows=max_rows)


def validate_bytes(data: bytes, kind: str | None, source_name: str, *, content_type: str | None = None,
                   fetcher: FetchPolicy | None = None, max_rows: int | None = MAX_ROWS) -> Report:
    """Validate an uploaded document held in memory (``validate_file`` for a spooled one)."""
    return validate_file(io.BytesIO(data), kind, source_name, content_type=content_type, fetcher=fetcher,
                         max_rows=max_rows)


def fetch_failed(url: str, exc: requests.RequestException) -> SourceError:
    """A request's failure as a validation says it, one line naming the URL once: ``<url>:
    connection refused`` (harvester.http.guard.failure_text: no urllib3 "Max retries exceeded", no
    class names). The URL is the one that failed (a redirect's hop, a next page), else ``url``. A
    connection that failed or timed out is SourceUnavailable (transient: the API answers 502, the
    portal failed); anything else (too many redirects) a SourceError."""
    failed = getattr(getattr(exc, "request", None), "url", None) or url
    text = f"{redact_url(failed)}: {failure_text(exc)}"
    if isinstance(exc, (requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError)):
        return SourceUnavailable(text)
    return SourceError(text)


def check_url(url: str) -> None:
    """Refused for a URL that is not http(s) (naming its scheme) or names no host."""
    parts = urlsplit(url.strip())
    if parts.scheme.lower() not in ("http", "https"):
        raise Refused(f"{url}: validation fetches only http(s) URLs, not {parts.scheme or 'a URL without a scheme'}"
                      f"{':' if parts.scheme else ''}")
    if not parts.hostname:
        raise Refused(f"{url}: the URL names no host")


def _ckan_base(url: str) -> str:
    parts = urlsplit(url)
    path = parts.path
    if "/api/" in path + "/":
        path = path[:(path + "/").index("/api/")]
    return f"{parts.scheme}://{parts.netloc}{path}"


def _answers_ckan(url: str, session: requests.Session, policy: FetchPolicy) -> bool:
    """Whether the site at ``url`` answers CKAN's status_show."""
    try:
        resp = session.get(f"{_ckan_base(url).rstrip('/')}/api/3/action/status_show", timeout=policy.timeout)
        return resp.ok and resp.json().get("success") is True
    except (requests.RequestException, ValueError, AttributeError):
        return False


def _probe(url: str, session: requests.Session, policy: FetchPolicy) -> tuple[str, str]:
    """(kind, how) of a URL whose name does not say: the start of its answer; for an HTML page or
    an answer that is not a document (a portal's home page, a 404), whether the site answers
    CKAN's status_show."""
    try:
        resp = session.get(url, stream=True, timeout=policy.timeout,
                           headers={"Accept": "application/json, application/rdf+xml, text/turtle, "
                                              "application/ld+json;q=0.9, */*;q=0.1"})
    except requests.RequestException as exc:
        raise fetch_failed(url, exc) from None
    try:
        ok, answered = 200 <= resp.status_code < 300, f"HTTP {resp.status_code} {resp.reason or ''}".rstrip()
        content_type = resp.headers.get("Content-Type", "")
        head = resp.raw.read(SNIFF_BYTES, decode_content=True) if ok else b""
    finally:
        resp.close()
    sniffed = sniff(head, content_type) if ok else None
    if sniffed:
        return sniffed, "the answer's content"
    html = "html" in content_type.lower() or head.lstrip()[:15].lower().startswith((b"<!doctype html", b"<html"))
    if (html or not ok) and _answers_ckan(url, session, policy):
        return CKAN, "the site (it answers CKAN's status_show)"
    if not ok:
        raise SourceError(f"{url}: GET answered {answered}")
    return (DCAT_RDF, "the answer's content (markup)") if html else (DCAT_JSON, "nothing (taken for a data.json)")


def validate_url(url: str, kind: str | None = None, *, pages: int = 3, page_size: int = PAGE_SIZE,
                 fetcher: FetchPolicy | None = None, max_rows: int | None = MAX_ROWS) -> Report:
    """Validate the catalogue at ``url`` through its kind's source: a paged API's first ``pages``
    pages (CKAN's package_search, ...), a data.json or an RDF catalogue whole (every Hydra page). ``kind``
    None: guessed from the URL, else from the start of its answer. ``page_size``: records a page
    (CKAN's rows). ``fetcher``: the FetchPolicy (default: no limits, private addresses allowed).
    ``max_rows``: the rows kept (``report_of``)."""
    _check_kind(kind)
    check_url(url)
    if pages < 1:
        raise ValueError(f"pages must be at least 1, not {pages}")
    policy = fetcher or FetchPolicy()
    session = policy.session()
    try:
        guessed = None
        if kind is None:
            by_name = kind_of_name(url)
            kind, how = (by_name, "the URL") if by_name else _probe(url, session, policy)
            guessed = f"{kind}, from {how}"
        target = _ckan_base(url) if kind == CKAN else url
        source = _source(target, kind, policy, session)
        # a paged API's first pages; a catalogue document whole (every Hydra page of an RDF one)
        listed, listing = _listed(source, pages=None if kind in (DCAT_JSON, DCAT_RDF) else pages, page_size=page_size)
        return report_of(url, kind, listed, guessed=guessed, listing=listing, max_rows=max_rows)
    except requests.RequestException as exc:  # (too many redirects, a redirect to another scheme, ...)
        raise fetch_failed(url, exc) from exc
    finally:
        session.close()
