"""``POST /api/validate`` of the Harvester app: check a catalogue as a harvest would, storing
nothing (harvester.pipeline.validate). Who may: whoever may edit a harvest DAG, as on every write
route (auth.validator: auth.writer), since it makes the server fetch URLs of the caller's choosing;
whoever may read the Harvester view when HARVESTER_VALIDATE_READERS is on.

Two ways to name the catalogue:

- a JSON body ``{"url": "...", "type": "dcat-json|dcat-rdf|ckan" (optional), "pages": N (optional,
  a CKAN portal's pages of package_search, default 3)}``;
- a multipart upload: the document in field ``file`` (its Content-Type one a catalogue can have),
  and optionally ``type``.

The answer: ``{source, kind, guessed, complete, records, failed, warned, groups, rows (the first
1000), rows_total}``.

Guards, since a caller may name any URL: only http(s) (422); every address a host resolves to (on
every request: redirects, pages, JSON-LD contexts) must be public, unless
HARVESTER_VALIDATE_ALLOW_PRIVATE or it is one of HARVESTER_VALIDATE_ALLOWED_ADDRESSES (422 naming
the host and the address); a document, uploaded or fetched, of at most HARVESTER_VALIDATE_MAX_BYTES
(413; an upload is counted as it streams in and written to an unlinked temporary file, never held
in memory).

Bounds, since the document is a stranger's (harvester.pipeline.validate_worker): each validation
runs in a child process of its own, its fetching and parsing within HARVESTER_VALIDATE_TIMEOUT_SECS
(504 naming what it was doing; the process is killed a second later) and its address space within
HARVESTER_VALIDATE_MAX_MEMORY (413 naming it); waiting for it holds no thread of the api-server.
At most HARVESTER_VALIDATE_CONCURRENCY run at once in one api-server process: one more is answered
429 with Retry-After at once, never queued. Every answer of a validation that ran says its time
and its peak memory (X-Validation-Seconds, X-Validation-Peak-Memory: bytes).
"""
from __future__ import annotations

import json
import logging
import math
from contextlib import contextmanager
from tempfile import TemporaryFile

from fastapi import APIRouter, Depends, HTTPException, Request, status
from fastapi.responses import JSONResponse

from harvester.ui import auth
from harvester.config.portals import VALIDATE_TYPES as KINDS  # the kinds validation reads

log = logging.getLogger(__name__)

router = APIRouter()

ROWS_SHOWN = 1000
MAX_PAGES = 100
MAX_JSON_BODY = 64 * 1024  # a JSON request names a URL: it is never large
MAX_FIELD = 1024  # a form field besides the file
FORM_OVERHEAD = 64 * 1024  # what a multipart body may hold besides the file (boundaries, headers, fields)
RETRY_AFTER_MAX = 10  # seconds a 429 asks to wait at most (most validations end well before their time)
# Media types a catalogue can be uploaded as; text/plain and application/octet-stream (what a
# browser sends for a suffix it does not know) only with a ``type``.
UPLOAD_TYPES = frozenset({
    "application/json", "application/ld+json", "application/gzip", "application/x-gzip", "application/rdf+xml",
    "application/xml", "text/xml", "text/turtle", "application/x-turtle", "application/n-triples", "text/n3",
    "application/x-ndjson", "application/jsonl", "application/jsonlines",
})
UPLOAD_TYPES_WITH_KIND = frozenset({"text/plain", "application/octet-stream"})


def _invalid(parameter: str, message: str) -> HTTPException:
    """422 shaped like FastAPI's own validation errors, naming the body's parameter."""
    return HTTPException(422, [{"loc": ["body", parameter], "msg": f"{parameter}: {message}", "type": "value_error"}])


def _media(value: str | None) -> str:
    return (value or "").split(";")[0].strip().lower()


def _too_large(limit: int) -> HTTPException:
    from harvester.pipeline.validate import size_text

    return HTTPException(status.HTTP_413_CONTENT_TOO_LARGE,
                         f"the document is larger than {size_text(limit)} (HARVESTER_VALIDATE_MAX_BYTES)")


def _settings():
    """(the FetchPolicy, the ReportSettings) of a validation; 503 naming a bad setting."""
    from dataclasses import replace

    from harvester.config.settings import SettingError, report_settings
    from harvester.pipeline.validate import FetchPolicy

    try:
        settings = report_settings()
        return replace(FetchPolicy.from_settings(), allowed=settings.validate_allowed), settings
    except SettingError as exc:
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, f"validation is misconfigured: {exc}") from None


class _Slots:
    """The validations running in this api-server process. Taken and given back on the event loop
    only (no lock: nothing awaits between the look and the take)."""

    def __init__(self):
        self.running = 0

    def check(self, limit: int, seconds: float) -> None:
        """429 with Retry-After when ``limit`` validations run already."""
        if self.running >= limit:
            from harvester.pipeline.validate_worker import KILL_MARGIN

            wait = max(1, min(RETRY_AFTER_MAX, math.ceil(seconds + KILL_MARGIN)))
            raise HTTPException(status.HTTP_429_TOO_MANY_REQUESTS,
                                f"{self.running} validations are running, as many as may run at once "
                                f"(HARVESTER_VALIDATE_CONCURRENCY={limit}): try again in {wait} s",
                                headers={"Retry-After": str(wait)})

    @contextmanager
    def taken(self, limit: int, seconds: float):
        self.check(limit, seconds)
        self.running += 1
        try:
            yield
        finally:
            self.running -= 1


_SLOTS = _Slots()


def _kind(value, parameter: str = "type") -> str | None:
    if value in (None, ""):
        return None
    if value not in KINDS:
        raise _invalid(parameter, f"{value!r} is not a type that can be validated; the types are {', '.join(KINDS)}")
    return value


# -- the upload, streamed -------------------------------------------------------------------------------
class _Upload:
    """A multipart body parsed as it streams in (python-multipart's parser): the ``file`` part
    written to a spooled temporary file and counted (413 past ``limit``), small fields kept."""

    def __init__(self, limit: int):
        self.limit = limit
        self.file = TemporaryFile()  # (unlinked: gone with its last descriptor)
        self.size = 0
        self.filename: str | None = None
        self.content_type: str | None = None
        self.has_file = False
        self.fields: dict[str, str] = {}
        self._headers: dict[str, str] = {}
        self._header_field = bytearray()
        self._header_value = bytearray()
        self._name: str | None = None
        self._value = bytearray()

    def callbacks(self) -> dict:
        return {"on_part_begin": self._begin, "on_header_field": self._field, "on_header_value": self._hvalue,
                "on_header_end": self._header_end, "on_headers_finished": self._headers_done,
                "on_part_data": self._data, "on_part_end": self._end}

    def _begin(self) -> None:
        self._headers, self._name, self._value = {}, None, bytearray()

    def _field(self, data: bytes, start: int, end: int) -> None:
        self._header_field += data[start:end]

    def _hvalue(self, data: bytes, start: int, end: int) -> None:
        self._header_value += data[start:end]

    def _header_end(self) -> None:
        self._headers[bytes(self._header_field).decode("latin-1").lower()] = bytes(self._header_value).decode(
            "latin-1")
        self._header_field, self._header_value = bytearray(), bytearray()

    def _headers_done(self) -> None:
        from python_multipart.multipart import parse_options_header

        _, options = parse_options_header(self._headers.get("content-disposition", ""))
        self._name = options.get(b"name", b"").decode("utf-8", "replace")
        if self._name == "file":
            if self.has_file:
                raise _invalid("file", "give one file")
            self.has_file = True
            self.filename = options.get(b"filename", b"").decode("utf-8", "replace") or None
            self.content_type = _media(self._headers.get("content-type")) or "application/octet-stream"
            if self.content_type not in UPLOAD_TYPES | UPLOAD_TYPES_WITH_KIND:
                raise HTTPException(status.HTTP_415_UNSUPPORTED_MEDIA_TYPE,
                                    f"an upload of type {self.content_type} cannot be a catalogue; upload JSON, "
                                    f"JSON-LD, RDF/XML, Turtle, N-Triples or gzip ({', '.join(sorted(UPLOAD_TYPES))})")

    def _data(self, data: bytes, start: int, end: int) -> None:
        if self._name == "file":
            self.size += end - start
            if self.size > self.limit:
                raise _too_large(self.limit)
            self.file.write(data[start:end])
        else:
            self._value += data[start:end]
            if len(self._value) > MAX_FIELD:
                raise _invalid(self._name or "field", f"longer than {MAX_FIELD} bytes")

    def _end(self) -> None:
        if self._name and self._name != "file":
            self.fields[self._name] = bytes(self._value).decode("utf-8", "replace")


async def _read_upload(request: Request, limit: int) -> _Upload:
    from python_multipart.multipart import MultipartParser, parse_options_header

    _, options = parse_options_header(request.headers.get("content-type", ""))
    boundary = options.get(b"boundary")
    if not boundary:
        raise _invalid("file", "a multipart body needs a boundary")
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > limit + FORM_OVERHEAD:
        raise _too_large(limit)  # said before a byte is read
    upload = _Upload(limit)
    parser = MultipartParser(boundary, upload.callbacks())
    try:
        async for chunk in request.stream():
            parser.write(chunk)
        parser.finalize()
    except HTTPException:
        upload.file.close()
        raise
    except Exception as exc:  # python-multipart's MultipartParseError and kin
        upload.file.close()
        raise _invalid("file", f"the multipart body cannot be read ({exc})") from None
    if not upload.has_file:
        upload.file.close()
        raise _invalid("file", "no file: upload the document in field 'file' (or send JSON naming a url)")
    return upload


async def _read_json(request: Request) -> dict:
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_JSON_BODY:
            raise HTTPException(status.HTTP_413_CONTENT_TOO_LARGE,
                                f"a JSON request names a URL; this one is over {MAX_JSON_BODY} bytes")
    try:
        data = json.loads(body)
    except ValueError as exc:
        raise _invalid("url", f"the body is not JSON ({exc})") from None
    except RecursionError:  # (64 kB of brackets: Python's json gives up at about 1,000 levels)
        raise _invalid("url", "the body nests deeper than a request naming a URL ever does") from None
    if not isinstance(data, dict):
        raise _invalid("url", "send an object: {\"url\": ..., \"type\": ..., \"pages\": ...}")
    return data


# -- running it -------------------------------------------------------------------------------------------
def _failure(error: dict, parameter: str, deadline: float) -> HTTPException:
    """What a validation that could not be made answers (``error``: the child's, validate_worker)."""
    kind, message = error.get("kind"), str(error.get("message"))
    if kind == "refused":
        return _invalid(parameter, message)
    if kind == "too-large":
        return _too_large(int(error["limit"]))
    if kind == "timeout":
        if not error.get("killed"):  # (the child's own: FetchTimeout, naming the URL)
            setting = f"(HARVESTER_VALIDATE_TIMEOUT_SECS={deadline:g})"
            message = (message.replace("(HARVESTER_VALIDATE_TIMEOUT_SECS)", setting)
                       if "(HARVESTER_VALIDATE_TIMEOUT_SECS)" in message
                       else f"the validation's time ran out {setting}: {message}")
        return HTTPException(status.HTTP_504_GATEWAY_TIMEOUT, message)
    if kind == "memory":
        return HTTPException(status.HTTP_413_CONTENT_TOO_LARGE, message)
    if kind == "transient":  # the portal failed (5xx, timeouts, connection errors)
        return HTTPException(status.HTTP_502_BAD_GATEWAY, f"the catalogue could not be fetched: {message}")
    if kind == "failed":
        log.error("validation failed: %s\n%s", message, error.get("output", ""))
        return HTTPException(status.HTTP_500_INTERNAL_SERVER_ERROR,
                             f"{message} (the api-server's log has the details)")
    return HTTPException(422, f"not a catalogue, or it cannot be read: {message}")


async def _run(fields: dict, parameter: str, policy, settings, document: int | None = None) -> JSONResponse:
    """The validation ``fields`` ask for, in a child process (validate_worker.run): its report, or
    the HTTPException its error makes; either with the child's time and peak memory as headers."""
    from harvester.pipeline import validate_worker as worker

    outcome = await worker.run({**fields, "rows": ROWS_SHOWN, "policy": worker.policy_fields(policy)},
                               deadline=policy.deadline, memory=settings.validate_max_memory, document=document)
    headers = {"X-Validation-Seconds": f"{outcome.seconds:.2f}"}
    if outcome.peak_memory is not None:
        headers["X-Validation-Peak-Memory"] = str(outcome.peak_memory)
    log.info("validation of %s: %s in %.1f s, peak memory %s bytes", fields.get("url") or fields.get("name"),
             (outcome.error or {}).get("kind", "done"), outcome.seconds, outcome.peak_memory)
    if outcome.error is not None:
        failure = _failure(outcome.error, parameter, policy.deadline)
        failure.headers = {**(failure.headers or {}), **headers}
        raise failure
    return JSONResponse(outcome.report, headers=headers)


@router.post("/api/validate", tags=["validate"], summary="Check a catalogue (a URL or an upload) as a harvest would")
async def api_validate(request: Request, user=Depends(auth.validator)):
    """The grouped report of a catalogue's records, as a harvest would write it, with nothing stored:
    a JSON body ``{"url", "type"?, "pages"?}`` or a multipart upload (``file``, ``type``?)."""
    from harvester.pipeline import validate as v
    from harvester.sources import SourceError

    media = _media(request.headers.get("content-type"))
    policy, settings = _settings()
    cap, seconds = settings.validate_concurrency, policy.deadline
    if media == "multipart/form-data":
        _SLOTS.check(cap, seconds)  # said before the upload is read (and again once it is)
        upload = await _read_upload(request, policy.max_bytes)
        try:
            kind = _kind(upload.fields.get("type"))
            if upload.content_type in UPLOAD_TYPES_WITH_KIND and kind is None:
                raise HTTPException(status.HTTP_415_UNSUPPORTED_MEDIA_TYPE,
                                    f"an upload of type {upload.content_type} is validated only with a type "
                                    f"({', '.join(KINDS)}): say which kind of catalogue it is")
            upload.file.flush()
            with _SLOTS.taken(cap, seconds):
                return await _run({"name": upload.filename or "upload", "kind": kind,
                                   "content_type": upload.content_type}, "file", policy, settings,
                                  document=upload.file.fileno())
        finally:
            upload.file.close()
    if media != "application/json":
        raise HTTPException(status.HTTP_415_UNSUPPORTED_MEDIA_TYPE,
                            "send JSON ({\"url\": ...}) or a multipart upload (field 'file'), "
                            f"not {media or 'a body of no type'}")
    data = await _read_json(request)
    url = data.get("url")
    if not isinstance(url, str) or not url.strip():
        raise _invalid("url", "give the catalogue's URL")
    kind = _kind(data.get("type"))
    pages = data.get("pages", 3)
    if isinstance(pages, bool) or not isinstance(pages, int) or not 1 <= pages <= MAX_PAGES:
        raise _invalid("pages", f"{pages!r} must be a whole number from 1 to {MAX_PAGES}")
    try:
        v.check_url(url.strip())
    except (SourceError, ValueError) as exc:
        raise _invalid("url", str(exc)) from None
    with _SLOTS.taken(cap, seconds):
        return await _run({"url": url.strip(), "kind": kind, "pages": pages}, "url", policy, settings)
