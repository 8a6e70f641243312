"""DCAT ``data.json`` catalogues (DCAT-US 1.1 and 3.0, DCAT-AR) as a source: ``type: dcat-json``.

A catalogue is one JSON document, often hundreds of MB. It is read as a stream (``ijson``): one
dataset entry is in memory at a time, never the document. Each entry becomes a CKAN-shaped package
(``to_package``), because everything downstream (hashes, history, search keys) reads CKAN's shape,
and then a ``DatasetRecord`` (``normalize``). Whatever the package's own fields do not hold goes to
its ``extras``, so that the metadata hash sees an edit anywhere in an entry except its ``modified``
date (which is ``metadata_modified``) and the order of its keywords and themes.

Where datasets are in the document:

- ``dataset[*]``, and ``dataset[*]`` of nested catalogues (DCAT-US 3.0 ``catalog[*]``, any depth);
- a bare top-level array of datasets (Project Open Data 1.0);
- datasets embedded in a DCAT-US 3.0 ``datasetSeries[*]`` (``seriesMember``, ``first``, ``last``)
  or a ``service[*].servesDataset``. Such an embedded copy of a dataset whose identifier the
  document already listed is the same dataset (JSON-LD embeds nodes): it is skipped, not failed.

Unusable entries become failed records (``DatasetRecord.error``) naming the dataset and every
problem found: no identifier (and no landing page to derive one from), no title, a field of the
wrong type, a licence that is a page of HTML rather than a name or URI, an identifier listed twice.
A failed entry whose identifier is known keeps it as ``source_id``, so a dataset still listed but
now broken is not mistaken for one the portal removed.

``DcatJsonSource`` fetches the catalogue with one conditional GET (ETag / Last-Modified): an
unchanged catalogue answers 304 and costs nothing more.
"""
from __future__ import annotations

import gzip
import io
import json
import logging
import re
import time
import zlib
from collections import Counter
from dataclasses import replace
from typing import Any, BinaryIO, Iterator, Mapping

import ijson
from urllib3.exceptions import HTTPError as Urllib3Error

from harvester.config.portals import DCAT_JSON
from harvester.domain.dataset import DatasetRecord, clean_text, normalize_url, package_record, sha256_hex, slug
from harvester.sources.base import Capabilities, CountsTraffic, Listing, SourceError, SourceUnavailable
from harvester.http import scrub_url

log = logging.getLogger(__name__)

# Entry keys mapped to package fields; every other key goes to ``extras``. What a publisher or a
# distribution holds besides the mapped name, URL, format and title (a contact address, a file's
# own modified date, its column descriptions) goes to ``extras`` key by key (see ``_extras``): the
# metadata hash reads only the name of an organization and the url, format and name of a resource.
_MAPPED = frozenset({"identifier", "title", "description", "keyword", "theme", "license", "modified", "issued",
                     "temporal", "landingPage", "publisher", "distribution"})
# A licence is a name or a URI; a longer text is a page pasted in (and too long a search key:
# PostgreSQL refuses index entries over 2712 bytes, which would fail the whole batch).
MAX_LICENSE_CHARS = 500
_HTML = re.compile(r"<[a-zA-Z/!][^>]*>")

# Paths (ijson prefixes) of the datasets in a document: listed ones, and embedded copies.
_LISTED = re.compile(r"(?:catalog\.item\.)*dataset\.item")
_LISTS = re.compile(r"(?:catalog\.item\.)*dataset")
_EMBEDDED = re.compile(r"(?:catalog\.item\.)*(?:datasetSeries\.item\.(?:seriesMember(?:\.item)?|first|last)"
                       r"|service\.item\.servesDataset(?:\.item)?)")
_OPEN = frozenset({"start_map", "start_array"})
_CLOSE = frozenset({"end_map", "end_array"})
_SCALARS = frozenset({"string", "number", "boolean", "null"})
_BOM = b"\xef\xbb\xbf"
_GZIP_MAGIC = b"\x1f\x8b"


class InvalidCatalogue(SourceError, ValueError):
    """The document is not a DCAT catalogue: not JSON, cut short, or without a ``dataset`` array."""


class InvalidEntry(ValueError):
    """One entry cannot be used; the message names the dataset and every problem found."""

    def __init__(self, message: str, source_id: str | None = None):
        super().__init__(message)
        self.source_id = source_id


class _Problem(ValueError):
    """One field's problem (collected into an ``InvalidEntry``)."""


# -- mapping: a DCAT dataset entry as a CKAN-shaped package ---------------------------------------
def _kind(value: Any) -> str:
    """A JSON value's kind, for messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, Mapping):
        return "an object"
    return type(value).__name__


def _identifier(entry: Mapping) -> tuple[str | None, str | None]:
    """(the entry's identifier, None) or (None, why it has none usable). A string, a number, or a
    DCAT-US 3.0 Identifier object with an ``@id`` (its ``notation`` alone is not unique enough)."""
    value = entry.get("identifier")
    if value is None or (isinstance(value, str) and not value.strip()):
        return None, "no identifier"
    if isinstance(value, str):
        return value.strip(), None
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value), None
    if isinstance(value, Mapping):
        at_id = value.get("@id")
        if isinstance(at_id, str) and at_id.strip():
            return at_id.strip(), None
        return None, "identifier is an object with no usable '@id'"
    return None, f"identifier is {_kind(value)}, not a string"


def _landing_id(entry: Mapping) -> str | None:
    """A stable identifier derived from the landing page, for entries without one."""
    landing = entry.get("landingPage")
    if isinstance(landing, str) and landing.strip():
        return "landing:" + sha256_hex(normalize_url(landing))[:32]
    return None


def source_id(entry: Any) -> str | None:
    """The identifier the entry's record gets (None when it has no usable one)."""
    if not isinstance(entry, Mapping):
        return None
    found, _ = _identifier(entry)
    if found is not None:
        return found
    if entry.get("identifier") is None or isinstance(entry.get("identifier"), str):
        return _landing_id(entry)  # missing or empty: the landing page stands in
    return None


def _label(entry: Mapping) -> str:
    """The dataset as messages name it: by title, else by identifier."""
    title = entry.get("title")
    if isinstance(title, str) and title.strip():
        text = clean_text(title)
        shown = text if len(text) <= 80 else text[:80] + "..."
        return f"dataset {shown!r}"
    found, _ = _identifier(entry)
    return f"dataset with identifier {found!r}" if found else "untitled dataset without identifier"


def _optional_text(entry: Mapping, key: str) -> str | None:
    value = entry.get(key)
    if value is None or isinstance(value, str):
        return value
    raise _Problem(f"{key} is {_kind(value)}, not a string")


def _title(entry: Mapping) -> str:
    value = entry.get("title")
    if value is None:
        raise _Problem("no title")
    if not isinstance(value, str):
        raise _Problem(f"title is {_kind(value)}, not a string")
    if not clean_text(value):
        raise _Problem("title is empty")
    return value.strip()


def _labels(entry: Mapping, key: str) -> list[str]:
    """Keywords or themes: a list of strings (numbers kept as text, DCAT-US 3.0 concepts by their
    label), or one string of comma-separated values. Unique, in order."""
    value = entry.get(key)
    if value is None:
        return []
    if isinstance(value, str):
        items: list = value.split(",")
    elif isinstance(value, list):
        items = value
    else:
        raise _Problem(f"{key} is {_kind(value)}, not a list of strings")
    out: dict[str, None] = {}
    for i, item in enumerate(items):
        if isinstance(item, Mapping):
            item = next((item[k] for k in ("prefLabel", "title", "name", "@id") if isinstance(item.get(k), str)), item)
        if isinstance(item, (int, float)) and not isinstance(item, bool):
            item = str(item)
        if not isinstance(item, str):
            raise _Problem(f"{key}[{i}] is {_kind(item)}, not a string")
        if item.strip():
            out[item.strip()] = None
    return list(out)


def _organization(entry: Mapping) -> dict | None:
    """The publisher as a CKAN organization: ``title`` its name, ``name`` a slug of it. (Its other
    keys, such as mbox or a subOrganizationOf chain, go to the extras.)"""
    value = entry.get("publisher")
    if value is None:
        return None
    if isinstance(value, Mapping):
        value = value.get("name")
        if value is not None and not isinstance(value, str):
            raise _Problem(f"publisher.name is {_kind(value)}, not a string")
    elif not isinstance(value, str):
        raise _Problem(f"publisher is {_kind(value)}, not an object")
    if not value or not value.strip():
        return None
    return {"title": value.strip(), "name": slug(value)}


def _distributions(entry: Mapping) -> list[tuple[dict, dict]]:
    """Each distribution as (a CKAN resource, the distribution's other keys). The resource:
    ``url`` the download URL (else the access URL), ``format`` the format (else the media type),
    ``name`` the title. The other keys go to the extras, where the metadata hash sees them (it reads
    only the url, format and name of a resource)."""
    value = entry.get("distribution")
    if value is None:
        return []
    if not isinstance(value, list):
        raise _Problem(f"distribution is {_kind(value)}, not a list")
    out = []
    for i, dist in enumerate(value):
        if not isinstance(dist, Mapping):
            raise _Problem(f"distribution[{i}] is {_kind(dist)}, not an object")
        for key in ("downloadURL", "accessURL", "format", "mediaType", "title"):
            if dist.get(key) is not None and not isinstance(dist[key], str):
                raise _Problem(f"distribution[{i}].{key} is {_kind(dist[key])}, not a string")
        url_key = "downloadURL" if (dist.get("downloadURL") or "").strip() else "accessURL"
        format_key = "format" if (dist.get("format") or "").strip() else "mediaType"
        resource = {"url": (dist.get(url_key) or "").strip(), "format": (dist.get(format_key) or "").strip(),
                    "name": (dist.get("title") or "").strip()}
        out.append((resource, {k: v for k, v in dist.items() if k not in (url_key, format_key, "title")}))
    return out


def _license(entry: Mapping) -> str | None:
    value = entry.get("license")
    if isinstance(value, Mapping):  # DCAT-US 3.0 LicenseDocument
        value = value.get("@id") if isinstance(value.get("@id"), str) else value.get("title")
    if value is None:
        return None
    if not isinstance(value, str):
        raise _Problem(f"license is {_kind(value)}, not a string")
    value = value.strip()
    if _HTML.search(value):
        raise _Problem(f"license is {len(value)} characters of HTML, not a licence name or URI")
    if len(value) > MAX_LICENSE_CHARS:
        raise _Problem(f"license is {len(value)} characters long, not a licence name or URI")
    return value or None


def _as_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, ensure_ascii=False,
                                                           separators=(",", ":"))


def _distribution_labels(entry: Mapping) -> list[str | None]:
    """The identifier of each distribution where it is unique in the dataset, else None."""
    ids = [d.get("identifier").strip() if isinstance(d.get("identifier"), str) and d["identifier"].strip() else None
           for d in entry.get("distribution") or []]
    counts = Counter(ids)
    return [i if i is not None and counts[i] == 1 else None for i in ids]


def _extras(entry: Mapping, distributions: list[tuple[dict, dict]]) -> list[dict]:
    """Everything the package's own fields do not hold, as CKAN extras (non-string values as JSON),
    so that the metadata hash sees every change: unmapped keys as they are, the publisher's keys
    besides its name as ``publisher.<key>``, the distributions' keys besides those of the resource
    as ``distribution[<identifier, or position>].<key>``, and a non-string identifier (a DCAT-US 3.0
    object)."""
    out = []
    for key, value in entry.items():
        if key == "publisher":
            if isinstance(value, Mapping):
                out += [{"key": f"publisher.{k}", "value": _as_text(v)} for k, v in value.items() if k != "name"]
        elif key == "distribution":
            for n, (label, (_, rest)) in enumerate(zip(_distribution_labels(entry), distributions)):
                out += [{"key": f"distribution[{label or n}].{k}", "value": _as_text(v)} for k, v in rest.items()
                        if not (label and k == "identifier")]
        elif key == "identifier":
            if not isinstance(value, str):
                out.append({"key": key, "value": _as_text(value)})
        elif key not in _MAPPED:
            out.append({"key": key, "value": _as_text(value)})
    return out


def to_package(entry: Any, catalog_url: str) -> dict:
    """A DCAT dataset entry as a CKAN-shaped package. Raises ``InvalidEntry`` naming the dataset and
    every problem found when the entry cannot be used. (``catalog_url`` is not needed by the mapping
    itself; ``normalize`` uses it for datasets without a landing page.)"""
    if not isinstance(entry, Mapping):
        raise InvalidEntry(f"entry is {_kind(entry)}, not a JSON object")
    problems = []
    ident = source_id(entry)
    if ident is None:
        _, why = _identifier(entry)
        problems.append(why + (" and no landing page" if why == "no identifier" else ""))
    parts: dict[str, Any] = {}
    fields = (("title", _title), ("notes", lambda e: _optional_text(e, "description")),
              ("tags", lambda e: _labels(e, "keyword")), ("organization", _organization),
              ("groups", lambda e: _labels(e, "theme")), ("distributions", _distributions), ("license_id", _license),
              ("metadata_modified", lambda e: _optional_text(e, "modified")),
              ("url", lambda e: _optional_text(e, "landingPage")))
    for key, extract in fields:
        try:
            parts[key] = extract(entry)
        except _Problem as exc:
            problems.append(str(exc))
    if problems:
        raise InvalidEntry(f"{_label(entry)}: {'; '.join(problems)}", source_id=ident)
    return {
        "id": ident,
        "title": parts["title"],
        "notes": parts["notes"],
        "tags": [{"name": k} for k in parts["tags"]],
        "organization": parts["organization"],
        "groups": [{"name": t} for t in parts["groups"]],
        "resources": [resource for resource, _ in parts["distributions"]],
        "license_id": parts["license_id"],
        "metadata_modified": parts["metadata_modified"],
        "issued": entry.get("issued"),
        "temporal": entry.get("temporal"),
        "url": parts["url"],
        "extras": _extras(entry, parts["distributions"]),
    }


def _is_http(url: Any) -> bool:
    return isinstance(url, str) and url.strip().lower().startswith(("http://", "https://"))


def normalize(entry: Any, catalog_url: str) -> DatasetRecord:
    """A DCAT dataset entry as a DatasetRecord; an unusable entry comes back failed, saying why."""
    try:
        pkg = to_package(entry, catalog_url)
    except InvalidEntry as exc:
        return DatasetRecord(source_id=exc.source_id, raw=entry, error=str(exc))
    title, description = clean_text(pkg["title"]), clean_text(pkg["notes"])
    if _is_http(pkg["url"]):
        url = pkg["url"].strip()
        url_hash = sha256_hex(normalize_url(url))
    else:  # no landing page: the entry's place in the catalogue (kept apart by its identifier)
        url = f"{catalog_url}#{pkg['id']}"
        url_hash = sha256_hex(f"{normalize_url(catalog_url)}#{pkg['id']}")
    org = pkg["organization"]
    return package_record(pkg, source_id=pkg["id"], url=url, url_hash=url_hash, title=title, description=description,
                          tags=sorted({t["name"] for t in pkg["tags"]}), organization=org.get("title") if org else None)


# -- streaming parse ------------------------------------------------------------------------------
class _Prefixed(io.RawIOBase):
    """A binary stream with some already-read bytes put back in front."""

    def __init__(self, head: bytes, rest: BinaryIO):
        self._head, self._rest = head, rest
        self.empty = False

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        if self._head:
            if size is None or size < 0:
                data, self._head = self._head + self._rest.read(), b""
                return data
            data, self._head = self._head[:size], self._head[size:]
            return data
        return self._rest.read() if size is None or size < 0 else self._rest.read(size)

    def readinto(self, buffer) -> int:
        data = self.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)


def _read_exactly(fp: BinaryIO, n: int) -> bytes:
    data = b""
    while len(data) < n:
        more = fp.read(n - len(data))
        if not more:
            break
        data += more
    return data


def _decoded(fp: BinaryIO) -> _Prefixed:
    """The JSON bytes of ``fp``: gunzipped if they are gzip (a ``data.json.gz`` served as a file),
    without a UTF-8 byte order mark."""
    head = _read_exactly(fp, 3)
    if head.startswith(_GZIP_MAGIC):
        return _decoded(gzip.GzipFile(fileobj=_Prefixed(head, fp), mode="rb"))
    at_end = len(head) < 3
    if head.startswith(_BOM):
        head = head[len(_BOM):]
    stream = _Prefixed(head, fp)
    stream.empty = at_end and not head.strip()
    return stream


def _build(events: Iterator, event: str) -> Any:
    """The value that starts with ``event``, built from the events up to its end (what
    ``ijson.ObjectBuilder`` does, inlined: this loop runs for every token of every entry)."""
    root: Any = {} if event == "start_map" else []
    stack = [root]
    key = None
    for _, ev, value in events:
        if ev == "map_key":
            key = value
            continue
        if ev == "start_map" or ev == "start_array":
            value = {} if ev == "start_map" else []
        elif ev == "end_map" or ev == "end_array":
            stack.pop()
            if not stack:
                return root
            continue
        parent = stack[-1]
        if type(parent) is dict:
            parent[key] = value
        else:
            parent.append(value)
        if ev == "start_map" or ev == "start_array":
            stack.append(value)
    raise ijson.IncompleteJSONError("the document ends inside a dataset")


def _located_entries(fp: BinaryIO, source: str) -> Iterator[tuple[Any, bool]]:
    """(entry, embedded) for each dataset entry in document order; ``embedded``: a copy inside a
    series or service, not a catalogue's own listing."""
    where = scrub_url(source)
    try:
        stream = _decoded(fp)
        if stream.empty:
            raise InvalidCatalogue(f"{where}: the document is empty, not a DCAT catalogue")
        events = ijson.parse(stream, use_float=True)
        first = next(events)
        bare_list = first[1] == "start_array"
        if not bare_list and first[1] != "start_map":
            raise InvalidCatalogue(f"{where}: the document is a single JSON value, not a DCAT catalogue")
        found = bare_list
        for prefix, event, value in events:
            if event in _OPEN:
                listed = prefix == "item" if bare_list else (prefix.endswith("dataset.item")
                                                             and _LISTED.fullmatch(prefix) is not None)
                if listed or (event == "start_map" and not bare_list and _EMBEDDED.fullmatch(prefix)):
                    found = True
                    yield _build(events, event), not listed
                elif event == "start_array" and not bare_list and _LISTS.fullmatch(prefix):
                    found = True
            elif event in _SCALARS and (prefix == "item" if bare_list else
                                        prefix.endswith("dataset.item") and _LISTED.fullmatch(prefix)):
                yield value, False  # not an object: normalize says so
        if not found:
            raise InvalidCatalogue(f"{where}: the JSON document has no 'dataset' array: not a DCAT catalogue")
    except ijson.JSONError as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InvalidCatalogue(f"{where}: not a valid JSON document ({reason[:200]})") from exc
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise InvalidCatalogue(f"{where}: the gzip stream is cut short or corrupt ({exc})") from exc


def iter_entries(fp: BinaryIO, *, source: str = "catalogue") -> Iterator[Any]:
    """The dataset entries of a catalogue read from the binary stream ``fp`` (plain or gzip), one
    at a time. Raises ``InvalidCatalogue`` (naming ``source``) for a document that is not one."""
    for entry, _ in _located_entries(fp, source):
        yield entry


def iter_records(fp: BinaryIO, catalog_url: str) -> Iterator[DatasetRecord]:
    """The catalogue's entries as DatasetRecords, streamed. An identifier listed again is a failed
    record (``duplicate identifier X (first seen as entry N)``, N counting entries from 1 in
    document order); an embedded copy of a dataset listed elsewhere in the document is skipped.
    Only the identifiers seen (with their entry numbers) are kept."""
    seen: dict[str, int] = {}  # identifier -> entry number, negative for an embedded copy
    for n, (entry, embedded) in enumerate(_located_entries(fp, catalog_url), 1):
        ident = source_id(entry)
        if ident is not None and ident in seen:
            first = seen[ident]
            if embedded or first < 0:
                log.debug("%s: entry %d is another copy of %r (entry %d), skipped", catalog_url, n, ident, abs(first))
                continue
            yield DatasetRecord(source_id=ident, raw=entry, error=f"entry {n}: {_label(entry)}: duplicate identifier "
                                                                   f"{ident!r} (first seen as entry {first})")
            continue
        if ident is not None:
            seen[ident] = -n if embedded else n
        record = normalize(entry, catalog_url)
        yield record if record.ok else replace(record, error=f"entry {n}: {record.error}")


# -- over HTTP ------------------------------------------------------------------------------------
def _validators(headers: Mapping) -> dict[str, str]:
    out = {}
    if headers.get("ETag"):
        out["etag"] = headers["ETag"]
    if headers.get("Last-Modified"):
        out["last_modified"] = headers["Last-Modified"]
    return out


def _conditional_headers(validators: Mapping | None) -> dict[str, str]:
    validators = validators or {}
    headers = {}
    if validators.get("etag"):
        headers["If-None-Match"] = validators["etag"]
    if validators.get("last_modified"):
        headers["If-Modified-Since"] = validators["last_modified"]
    return headers


class DcatJsonSource(CountsTraffic):
    """A ``data.json`` catalogue at ``url``, fetched whole with one (conditional) GET through
    ``fetcher`` (sources/http.py) and streamed into pages of records.

    After ``iter_pages``: ``not_modified`` (the portal answered 304), ``validators`` (the
    response's ETag / Last-Modified, to send next time) and ``listed`` (entries read)."""

    kind = DCAT_JSON
    capabilities = Capabilities(conditional=True)

    def __init__(self, url: str, *, fetcher, page_size: int = 1000):
        self.url, self.fetcher, self.page_size = url, fetcher, page_size
        self.not_modified = False
        self.validators: dict[str, str] = {}
        self.listed = 0
        self.failed = 0
        self._done = False

    def __repr__(self) -> str:
        return f"DcatJsonSource({scrub_url(self.url)!r})"


    @property
    def total(self) -> int | None:
        """Entries in the catalogue, once it has been read (a document says so only at its end)."""
        return self.listed if self._done else None

    def iter_pages(self, validators: dict | None = None, *, conditional: bool = True,
                   page_size: int | None = None) -> Iterator[list[DatasetRecord]]:
        """Pages of at most ``page_size`` records: the whole catalogue, or nothing when the portal
        answers 304 to ``validators`` (sent only when ``conditional``). Raises ``SourceError`` for
        a 4xx (or any answer that is neither 2xx nor 304), ``SourceUnavailable`` when the
        connection fails mid-body, ``InvalidCatalogue`` for a body that is not a catalogue."""
        self.not_modified, self.validators, self.listed, self.failed, self._done = False, {}, 0, 0, False
        size = page_size or self.page_size
        headers = _conditional_headers(validators) if conditional else {}
        started = time.monotonic()
        resp = self.fetcher.get(self.url, headers=headers or None, stream=True)
        try:
            if resp.status_code == 304:
                self.not_modified, self._done = True, True
                self.validators = {**(validators or {}), **_validators(resp.headers)}
                log.info("%s: not modified since the last run (304)", scrub_url(self.url))
                return
            if not 200 <= resp.status_code < 300:
                raise SourceError(f"{scrub_url(self.url)}: GET answered HTTP {resp.status_code} "
                                  f"{resp.reason or ''}".rstrip())
            yield from self._pages(resp, size)
            self.validators = _validators(resp.headers)
            self._done = True
            log.info("%s: %d entries (%d failed), %d bytes in %.1fs", scrub_url(self.url), self.listed,
                     self.failed, self.bytes_received, time.monotonic() - started)
        finally:
            resp.close()

    def _pages(self, resp, size: int) -> Iterator[list[DatasetRecord]]:
        raw = resp.raw
        raw.decode_content = True  # Content-Encoding: gzip / deflate undone as the body streams
        page: list[DatasetRecord] = []
        try:
            for record in iter_records(raw, self.url):
                self.listed += 1
                self.failed += not record.ok
                page.append(record)
                if len(page) >= size:
                    yield page
                    page = []
            if page:
                yield page
        except (Urllib3Error, OSError) as exc:
            raise SourceUnavailable(f"{scrub_url(self.url)}: the catalogue's body broke off after "
                                    f"{self.listed} entries ({type(exc).__name__})") from exc
        finally:
            self.fetcher.add_bytes(_wire_bytes(raw))

    def iter_records(self, since, page_size: int, listing: Listing,
                     validators: dict | None = None) -> Iterator[list[DatasetRecord]]:
        """The Source protocol (sources/base.py): the whole catalogue every time (``since`` cannot
        be asked of a file), conditional on ``validators``. ``listing`` is filled once the
        catalogue has been read to its end."""
        yield from self.iter_pages(validators, conditional=bool(validators), page_size=page_size)
        listing.not_modified = self.not_modified
        listing.complete = not self.not_modified
        listing.validators = dict(self.validators)


def _wire_bytes(raw) -> int:
    """Body bytes as they came over the wire (compressed, if they came compressed)."""
    try:
        told = raw.tell()
    except (AttributeError, OSError, ValueError):
        return 0
    return told if isinstance(told, int) and told > 0 else 0
