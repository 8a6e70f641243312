"""SDMX REST services (``type: sdmx``): the dataflows of statistical offices (Eurostat, ECB, OECD,
ISTAT, INSEE, IMF...) read from one SDMX-ML structure message.

The request. ``url`` is the service's base (its REST entry point, e.g.
``https://bdm.insee.fr/series/sdmx``): the source asks
``{url}/dataflow/all/all/latest?detail=full&references=none`` (the latest version of every dataflow
of every agency, nothing they reference: the SDMX 2.1 REST API's structure query, sdmx-rest
``v2_1/ws/rest/docs/4_3_structural_queries.md``), with ``Accept:
application/vnd.sdmx.structure+xml;version=2.1`` (3.0 next). ``detail=full`` and
``references=none`` are the standard's defaults, sent because a service whose defaults differ
would send every DSD and codelist (Eurostat: thousands); a service answering 400 or 501 to them is
asked once more without them. ``allcompletestubs`` is not asked: its stubs drop a dataflow's
``Structure`` (its DSD reference), which Harvester keeps. A url that already names the resource
(a ``dataflow`` path segment: ``{ws}/dataflow/ESTAT/all/latest``, an agency's dataflows; an SDMX
3.0 REST API's ``{ws}/structure/dataflow/*/*/~``), a saved message (a path ending ``.xml``) and any
url that is not http(s) (a document ``harvester validate`` serves) are asked as they are.

The answer, one message, no paging and no total (the standard has neither): it is read as a
stream by expat (``_MessageReader``), a dataflow at a time, never as a tree: only the children of
``Structures/Dataflows`` are built (a message with references carries DSDs and codelists beside
them: skipped as they stream), each capped at ``MAX_DATAFLOW_CHARS``, and pages of ``page_size``
records go out while the rest is still arriving. Elements are matched by namespace URI, never by
prefix (``mes/str/com``, ``m/s/c``, ``message/structure/common`` all occur): any SDMX-ML version's
``http://www.sdmx.org/resources/sdmxml/schemas/vX_Y/...`` (2.1 and 3.0 in the samples; in 3.0 a
dataflow's ``Structure`` is a URN as text instead of a ``Ref``). A DOCTYPE is refused outright
(SDMX-ML messages have none; its entities are how a kilobyte becomes gigabytes), and no external
entity is ever read. The guarded client caps the body's size and time (HARVESTER_FETCH_MAX_STREAM_BYTES,
HARVESTER_FETCH_DEADLINE_SECS): an answer that never ends is cut there.

Each dataflow becomes a CKAN-shaped package (``dataflow_record``): ``source_id`` is
``agencyID:id`` (the version is not part of the identity: a new version is a change of the same
dataset, as Ceres and sdmx1's ``DataflowDefinition`` keys have it); ``Name`` in every language goes
to ``translations.title`` and ``Description`` to ``translations.description``, the title and
description shown being the portal's ``language`` (else English, else the first given; a name
without ``xml:lang`` is English, the schema's default, as in sdmx1) and ``DatasetRecord.language``
that title's language; ``organization`` the maintenance agency; ``metadata_modified`` the latest
of the update annotations some services write (Eurostat ``UPDATE_DATA`` / ``UPDATE_STRUCTURE``,
``2023-01-23T11:00:00+0100``; ISTAT ``LAST_UPDATE``), else none; the version, urn, isFinal, other
attributes, the structure (DSD) reference and every annotation as extras, so the metadata hash sees
a version bump or an update annotation; the landing page the dataflow's ``structureURL``, else its
structure query ``{ws}/dataflow/{agency}/{id}/{version}``, else (a saved message) its urn; one
resource, its data query ``{ws}/data/{agency},{id},{version}``. A dataflow without a name (a
stub, Norges Bank's) is stored under its id (``title-from-identifier``); one without an id
(from its attributes or its urn) is failed (``no-identifier``); an id listed twice, failed
(``duplicate-identifier``).

Change detection: structure queries have no modified-since parameter (``updatedAfter`` is for
data queries only), so every run reads the whole list, which is then complete: removals are found
every run. The request is conditional (``If-None-Match`` / ``If-Modified-Since`` from the last
committed run's ``ETag`` / ``Last-Modified``): a service that supports them answers ``304`` to an
unchanged list (one request, nothing processed). Unchanged dataflows are free by their hashes.

Answers (sdmx-rest ``4_8_errors.md``): ``204``, or ``404`` with SDMX error 100 "No results
found", is a service that lists no dataflows: an empty listing that is NOT complete (an answer
saying "nothing" never removes a portal's datasets; if the service really emptied, remove the
portal). ``413`` (SDMX 510 / 130: the response would exceed the service's limit) is terminal,
saying to name an agency in the url. Any other 4xx is terminal naming the SDMX error when one
came; 5xx and 429 are retried (harvester.http); a 2xx body that is an HTML page is retried; one that
is SDMX-JSON, another SDMX message or not well-formed XML is terminal. A body cut short is asked
again (``fetcher.max_retries`` times), the dataflows already listed skipped.
"""
from __future__ import annotations

import logging
import re
from dataclasses import replace
from typing import Iterator
from urllib.parse import urlsplit
from xml.parsers import expat

from urllib3.exceptions import HTTPError as Urllib3Error

from harvester.config.portals import SDMX
from harvester.domain.dataset import DatasetRecord, clean_text, failed, package_record, parse_timestamp, slug
from harvester.domain.outcomes import problem
from harvester.domain.screening import MAX_RECORD_BYTES
from harvester.http import Retryable, conditional_headers, scrub_url, streamed_bytes, validators_of
from harvester.http.guard import failure_text
from harvester.sources.base import Capabilities, CountsTraffic, Listing, SourceError, SourceUnavailable
from harvester.sources.xml_chars import Forbidden
from harvester.sources.xml_chars import identifier_problem as forbidden_identifier
from harvester.sources.xml_chars import warning as forbidden_warning

log = logging.getLogger(__name__)

ACCEPT = ("application/vnd.sdmx.structure+xml;version=2.1, application/vnd.sdmx.structure+xml;version=3.0;q=0.9, "
          "application/xml;q=0.5, text/xml;q=0.5")
QUERY = "dataflow/all/all/latest"
PARAMS = {"detail": "full", "references": "none"}
# Annotation types services write a dataflow's last update in (Eurostat, ISTAT, .Stat); the latest
# readable one is the dataset's modification time.
UPDATE_ANNOTATIONS = ("UPDATE_DATA", "UPDATE_STRUCTURE", "LAST_UPDATE", "LASTUPDATE", "DISSEMINATION_TIMESTAMP_DATA",
                      "DISSEMINATION_TIMESTAMP_STRUCTURE")
# One dataflow's text and attributes, at most (real ones: a few kB; the cap of a record's JSON).
MAX_DATAFLOW_CHARS = MAX_RECORD_BYTES
# What is read of an error answer's body (an SDMX error message: a few hundred bytes).
MAX_ERROR_BYTES = 64 * 1024
_CHUNK = 64 * 1024
_SDMX_NS = re.compile(r"^http://www\.sdmx\.org/resources/sdmxml/schemas/v(\d+)_(\d+)/(message|structure|common)$")
XML_LANG = "{http://www.w3.org/XML/1998/namespace}lang"
_URN = re.compile(r"=(?P<agency>[^:=()]+):(?P<id>[^:=()]+)\((?P<version>[^()]*)\)\s*$")
_ERROR_CODE = re.compile(rb"ErrorMessage[^>]*\bcode\s*=\s*[\"'](\d+)[\"']")
_TOO_LARGE_CODES = ("510", "130")


class SdmxError(SourceError):
    """An SDMX error message (``code``: its ErrorMessage code, ``text`` its Text) or a refusal."""

    def __init__(self, message: str, code: str | None = None, text: str = ""):
        super().__init__(message)
        self.code, self.text = code, text


class NoDataflows(Exception):
    """The service answered that it lists nothing (204, or 404 with SDMX error 100)."""


class MessageRefused(SourceError):
    """The answer is not an SDMX-ML structure message Harvester reads (or is a hostile one)."""


# -- the message, a dataflow at a time ------------------------------------------------------------------
def _split(tag: str) -> tuple[str, str]:
    """``uri}local`` (expat's name with our separator) as (uri, local)."""
    uri, sep, local = tag.rpartition("}")
    return (uri, local) if sep else ("", tag)


def _sdmx(uri: str) -> tuple[str, str] | None:
    """(version, part) of an SDMX-ML namespace (("2.1", "structure")), None for any other."""
    match = _SDMX_NS.match(uri)
    return (f"{match.group(1)}.{match.group(2)}", match.group(3)) if match else None


class _Node:
    """An element of a dataflow as read: ``tag`` (``{uri}local``), ``attrs``, ``text``, ``children``."""

    __slots__ = ("tag", "attrs", "parts", "children")

    def __init__(self, tag: str, attrs: dict):
        self.tag, self.attrs, self.parts, self.children = tag, attrs, [], []

    @property
    def local(self) -> str:
        return self.tag.rpartition("}")[2]

    @property
    def text(self) -> str:
        return "".join(self.parts).strip()

    def all(self, local: str) -> list["_Node"]:
        return [c for c in self.children if c.local == local]

    def first(self, local: str) -> "_Node | None":
        return next((c for c in self.children if c.local == local), None)


class _MessageReader:
    """An expat parser fed a message's bytes (``feed``), collecting its dataflows (``_Node`` trees,
    taken with ``take``): the root must be an SDMX-ML ``Structure`` (an ``Error`` raises
    ``SdmxError``; anything else ``MessageRefused``); only the element children of a
    ``Structures/Dataflows`` are built, each at most ``MAX_DATAFLOW_CHARS`` (past it the dataflow is
    handed over as ``(attrs, None)``: too large)."""

    def __init__(self, where: str):
        self.where = where
        self.version: str | None = None  # the SDMX-ML version of the root's namespace
        self.ended = False  # the root element closed
        self._path: list[str] = []  # local names of the open elements outside a dataflow
        self._stack: list[_Node] = []  # the open elements of the dataflow being built
        self._size = 0
        self._too_large = False
        self._done: list[tuple[dict, _Node | None]] = []
        self._error: list = [None, []]  # an Error message: [code, texts]
        parser = expat.ParserCreate(namespace_separator="}")
        parser.SetParamEntityParsing(expat.XML_PARAM_ENTITY_PARSING_NEVER)
        parser.StartDoctypeDeclHandler = self._doctype
        parser.EntityDeclHandler = self._entity
        parser.ExternalEntityRefHandler = self._external
        parser.StartElementHandler = self._start
        parser.EndElementHandler = self._end
        parser.CharacterDataHandler = self._chars
        parser.buffer_text = True
        parser.buffer_size = _CHUNK
        self._parser = parser

    # refusals
    def _doctype(self, name, system_id, public_id, has_internal_subset):
        raise MessageRefused(f"{self.where}: the answer declares a DOCTYPE ({name}): refused (SDMX-ML messages have "
                             "none; a DOCTYPE's entities expand a small document into gigabytes)")

    def _entity(self, name, *args):
        raise MessageRefused(f"{self.where}: the answer declares the entity {name}: refused")

    def _external(self, context, base, system_id, public_id):
        raise MessageRefused(f"{self.where}: the answer refers to the external entity {system_id!r}: refused, "
                             "never opened")

    # elements
    def _start(self, name: str, attrs: dict) -> None:
        uri, local = _split(name)
        tag = f"{{{uri}}}{local}" if uri else local
        if self._stack:
            self._grow(sum(len(k) + len(v) for k, v in attrs.items()) + len(local))
            node = _Node(tag, {self._attr(k): v for k, v in attrs.items()})
            if not self._too_large:
                self._stack[-1].children.append(node)
            self._stack.append(node)
            return
        if not self._path:
            known = _sdmx(uri)
            if known is None or known[1] != "message" or local not in ("Structure", "Error"):
                raise MessageRefused(self._not_structure(uri, local))
            self.version = known[0]
        elif (local == "Dataflow" and self._path[-1] == "Dataflows" and len(self._path) >= 3
              and self._path[-2] == "Structures" and (_sdmx(uri) or ("", ""))[1] == "structure"):
            self._size, self._too_large = 0, False
            self._stack.append(_Node(tag, {self._attr(k): v for k, v in attrs.items()}))
            return
        elif self._path[0] == "Error" and local == "ErrorMessage":
            self._error[0] = attrs.get("code")
        self._path.append(local)

    def _end(self, name: str) -> None:
        if self._stack:
            node = self._stack.pop()
            if not self._stack:
                self._done.append((node.attrs, None if self._too_large else node))
            return
        local = self._path.pop()
        if not self._path:
            self.ended = True
            if local == "Error":
                code, texts = self._error
                raise SdmxError(f"{self.where}: the service answered SDMX error {code or '(no code)'}"
                                f"{': ' + ' '.join(texts) if texts else ''}", code, " ".join(texts))

    def _chars(self, data: str) -> None:
        if self._stack:
            self._grow(len(data))
            if not self._too_large:
                self._stack[-1].parts.append(data)
        elif self._path and self._path[0] == "Error" and self._path[-1] == "Text" and len(self._error[1]) < 10:
            self._error[1].append(data.strip()[:500])

    def _grow(self, n: int) -> None:
        self._size += n
        if self._size > MAX_DATAFLOW_CHARS and not self._too_large:
            self._too_large = True
            del self._stack[0].children[:]
            del self._stack[0].parts[:]

    @staticmethod
    def _attr(name: str) -> str:
        uri, local = _split(name)
        return f"{{{uri}}}{local}" if uri else local

    def _not_structure(self, uri: str, local: str) -> str:
        known = _sdmx(uri)
        what = (f"an SDMX-ML {known[0]} {local} message" if known else
                f"<{local}> in the namespace {uri}" if uri else f"<{local}> in no namespace")
        return f"{self.where}: the answer is {what}, not an SDMX-ML structure message (mes:Structure)"

    # feeding
    def feed(self, data: bytes, final: bool = False) -> None:
        try:
            self._parser.Parse(data, final)
        except expat.ExpatError as exc:
            raise MessageRefused(f"{self.where}: the answer is not well-formed XML ({expat.ErrorString(exc.code)} at "
                                 f"line {exc.lineno}, column {exc.offset})") from None
        except RecursionError:
            raise MessageRefused(f"{self.where}: the answer nests elements too deep") from None

    def take(self) -> list[tuple[dict, _Node | None]]:
        done, self._done = self._done, []
        return done


# -- one dataflow as a record ----------------------------------------------------------------------------
def _localized(node: _Node, local: str) -> dict[str, str]:
    """{language: text} of ``node``'s ``local`` children (``Name``...): a text without xml:lang is
    English (the SDMX-ML schema's default), the first text of a language wins."""
    out: dict[str, str] = {}
    for child in node.all(local):
        text = child.text
        if text:
            out.setdefault((child.attrs.get(XML_LANG) or "en").strip().lower() or "en", text)
    return out


def pick_language(texts: dict[str, str], language: str | None) -> tuple[str, str | None]:
    """(text, its language) in ``language`` (``fr`` takes ``fr-CH`` too), else English, else the
    first language in alphabetical order; ("", None) when there is none."""
    for wanted in ([language.lower()] if language else []) + ["en"]:
        if wanted in texts:
            return texts[wanted], wanted
        for lang in sorted(texts):
            if lang.split("-")[0] == wanted:
                return texts[lang], lang
    if texts:
        first = sorted(texts)[0]
        return texts[first], first
    return "", None


def _annotation(node: _Node) -> dict:
    out: dict = {}
    if node.attrs.get("id"):
        out["id"] = node.attrs["id"]
    for local, key in (("AnnotationType", "type"), ("AnnotationTitle", "title"), ("AnnotationURL", "url"),
                       ("AnnotationValue", "value")):
        child = node.first(local)
        if child is not None and child.text:
            out[key] = child.text
    texts = _localized(node, "AnnotationText")
    if texts:
        out["texts"] = texts
    return out


def _structure(node: _Node | None) -> dict | None:
    """The dataflow's DSD reference: a 2.1 ``Ref``'s attributes (with the DSD's urn made from them), or
    a 3.0 URN."""
    if node is None:
        return None
    ref = node.first("Ref")
    if ref is not None:
        out = dict(ref.attrs)
        if out.get("agencyID") and out.get("id"):
            out.setdefault("urn", f"urn:sdmx:org.sdmx.infomodel.datastructure.DataStructure={out['agencyID']}:"
                                  f"{out['id']}({out.get('version', '1.0')})")
        return out
    urn = node.first("URN")
    text = urn.text if urn is not None else node.text
    return {"urn": text} if text else None


def _identity(attrs: dict) -> tuple[str, str, str]:
    """(agency, id, version) from the attributes, else from the urn."""
    urn = _URN.search(attrs.get("urn") or "")
    pick = lambda key, group: (attrs.get(key) or "").strip() or (urn.group(group).strip() if urn else "")  # noqa: E731
    return pick("agencyID", "agency"), pick("id", "id"), pick("version", "version")


def _modified(annotations: list[dict], shown: str) -> tuple[str | None, list]:
    """The latest update annotation's time (ISO 8601, UTC) and the warnings of those unreadable."""
    times, warnings = [], []
    for n, a in enumerate(annotations):
        if (a.get("type") or "").upper() not in UPDATE_ANNOTATIONS:
            continue
        values = [a.get("title")] + list((a.get("texts") or {}).values())
        values = [v for v in values if v]
        parsed = next((t for t in (parse_timestamp(v) for v in values) if t is not None), None)
        if parsed is not None:
            times.append(parsed)
        elif values:
            warnings.append(problem("bad-optional-date", f"dataflow {shown}: the {a['type']} annotation "
                                    f"{values[0][:100]!r} is not a date", f"annotations[{n}]", values[0]))
    return (max(times).isoformat() if times else None), warnings


def dataflow_record(attrs: dict, node: _Node | None, *, service: str | None, language: str | None,
                    sdmx_ml: str | None = None, rest_v2: bool = False) -> DatasetRecord:
    """One ``Dataflow`` as a record. ``node`` None: the dataflow was larger than MAX_DATAFLOW_CHARS.
    ``service``: the REST entry point (None for a saved message: no structure or data query URL;
    ``rest_v2``: an SDMX REST 2.x one, see ``query_urls``)."""
    agency, flow_id, version = _identity(attrs)
    source_id = f"{agency}:{flow_id}" if agency and flow_id else flow_id or None
    shown = source_id or attrs.get("urn") or "(no id)"
    if not flow_id:
        return failed(None, {"attributes": attrs}, [problem(
            "no-identifier", "a dataflow has neither an id attribute nor a urn to read one from", "@id")])
    if node is None:
        return failed(source_id, {"id": source_id}, [problem(
            "record-too-large", f"dataflow {shown} is more than {MAX_DATAFLOW_CHARS:,} characters", None)])
    names, descriptions = _localized(node, "Name"), _localized(node, "Description")
    title, title_language = pick_language(names, language)
    warnings = []
    if not title:
        title = flow_id
        warnings.append(problem("title-from-identifier", f"dataflow {shown} has no Name: its id stands for it", "Name"))
    description = (descriptions.get(title_language) if title_language in descriptions
                   else pick_language(descriptions, language)[0])
    annotations = [_annotation(a) for container in node.all("Annotations") for a in container.all("Annotation")]
    modified, date_warnings = _modified(annotations, shown)
    structure = _structure(node.first("Structure"))
    mapped = {"Name", "Description", "Annotations", "Structure"}
    other = {}
    for child in node.children:
        if child.local not in mapped and (child.text or child.attrs):
            other.setdefault(child.local, []).append({**child.attrs, **({"text": child.text} if child.text else {})})
    structure_query, data_query = query_urls(service, agency, flow_id, version, rest_v2) if service else (None, None)
    landing = (attrs.get("structureURL") or "").strip()
    if not landing.lower().startswith(("http://", "https://")):
        landing = structure_query or (attrs.get("urn") or "").strip() or (
            f"urn:sdmx:org.sdmx.infomodel.datastructure.Dataflow={agency}:{flow_id}({version or '1.0'})")
    resources = []
    if data_query:
        resources.append({"url": data_query, "format": "SDMX", "name": f"data of {shown} {version}".rstrip(),
                          "description": "the dataflow's data query (SDMX REST)"})
    extras = [{"key": f"sdmx:{k}", "value": v} for k, v in sorted(attrs.items())
              if k not in ("id", "agencyID", "version")]
    if structure:
        extras.append({"key": "sdmx:structure", "value": structure})
    if annotations:
        extras.append({"key": "sdmx:annotations", "value": annotations})
    if other:
        extras.append({"key": "sdmx:other", "value": other})
    package = {
        "id": source_id,
        "title": clean_text(title),
        "notes": description,
        "url": landing,
        "metadata_modified": modified,
        "version": version or None,
        "organization": {"title": agency, "name": slug(agency)} if agency else None,
        "tags": [],
        "resources": resources,
        "extras": extras,
        "translations": {"title": names, "description": descriptions},
        "schema": f"sdmx-ml-{sdmx_ml}" if sdmx_ml else "sdmx-ml",
    }
    return package_record(package, source_id=source_id, url=landing, title=clean_text(title),
                          description=clean_text(description), tags=[], organization=agency or None,
                          warnings=tuple(warnings + date_warnings), language=title_language)


# -- the request ------------------------------------------------------------------------------------------


def asked_as_is(url: str) -> bool:
    """Whether ``url`` is asked as it is rather than as a service base: a document (not http(s), or
    a path ending ``.xml``) or a query naming the dataflow resource (a ``dataflow`` path segment)."""
    parts = urlsplit(url)
    if parts.scheme.lower() not in ("http", "https"):
        return True
    path = parts.path.lower()
    return path.endswith(".xml") or "dataflow" in path.strip("/").split("/")


def service_of(url: str) -> tuple[str | None, bool]:
    """(the REST entry point a url is of: the url itself, or what precedes its ``dataflow`` segment;
    None for a document, whether it is an SDMX REST 2.x API (SDMX 3.0: ``{ws}/structure/dataflow``))."""
    parts = urlsplit(url)
    if parts.scheme.lower() not in ("http", "https") or parts.path.lower().endswith(".xml"):
        return None, False
    segments = parts.path.rstrip("/").split("/")
    lowered = [s.lower() for s in segments]
    v2 = False
    if "dataflow" in lowered:
        cut = lowered.index("dataflow")
        if cut and lowered[cut - 1] == "structure":
            cut, v2 = cut - 1, True
        segments = segments[:cut]
    return f"{parts.scheme}://{parts.netloc}{'/'.join(segments)}".rstrip("/"), v2


def query_urls(service: str, agency: str, flow_id: str, version: str, v2: bool = False) -> tuple[str, str]:
    """(the dataflow's structure query, its data query) at ``service``: SDMX REST 1.x
    (``{ws}/dataflow/A/ID/V``, ``{ws}/data/A,ID,V``) or 2.x (``{ws}/structure/dataflow/A/ID/V``,
    ``{ws}/data/dataflow/A/ID/V/*``)."""
    agency, version = agency or "all", version or "latest"
    if v2:
        return (f"{service}/structure/dataflow/{agency}/{flow_id}/{version}",
                f"{service}/data/dataflow/{agency}/{flow_id}/{version}/*")
    return f"{service}/dataflow/{agency}/{flow_id}/{version}", f"{service}/data/{agency},{flow_id},{version}"


def _error_of(body: bytes) -> tuple[str | None, str]:
    """(code, text) of an SDMX error message body (read leniently: some services leave its
    prefixes undeclared); (None, "") when it is none."""
    match = _ERROR_CODE.search(body)
    if not match:
        return None, ""
    texts = re.findall(rb"<(?:[\w.-]+:)?Text\b[^>]*>([^<]*)<", body)
    return match.group(1).decode(), " ".join(t.decode("utf-8", "replace").strip() for t in texts)[:500]


class SdmxSource(CountsTraffic):
    """The dataflows of the SDMX REST service at ``url`` (see the module's docstring), through
    ``fetcher`` (an ``http.HttpFetcher``). ``portal``: the Portal (its name for messages, its
    ``language_code`` for the title shown)."""

    kind = SDMX
    capabilities = Capabilities(conditional=True)

    def __init__(self, url: str, *, fetcher, portal=None, language: str | None = None):
        self.url, self.fetcher = url.rstrip("/") if not asked_as_is(url) else url, fetcher
        self.language = language if language is not None else getattr(portal, "language_code", None)
        name = getattr(portal, "name", None)
        self.label = f"portal {name} ({scrub_url(url)})" if name else scrub_url(url)
        self.service, self.rest_v2 = service_of(url)
        self.query_url = url if asked_as_is(url) else f"{self.url}/{QUERY}"
        self.not_modified = False
        self.validators: dict[str, str] = {}
        self.listed = 0
        self.complete = False
        self._done = False
        self.forbidden = Forbidden()  # characters XML 1.0 forbids met in the message (sources/xml_chars.py)

    def __repr__(self) -> str:
        return f"SdmxSource({scrub_url(self.url)!r})"

    @property
    def total(self) -> int | None:
        """Dataflows in the message, once it has been read (the standard gives no count)."""
        return self.listed if self._done else None

    # -- one GET
    def _get(self, validators: dict | None):
        """(the streamed 2xx answer, its first bytes), or ``_NotModified`` for a 304; raises NoDataflows for a
        service listing nothing, SdmxError / SourceError for the rest (4xx: terminal)."""
        params = None if asked_as_is(self.url) else dict(PARAMS)
        shown = f"{self.label}: GET {scrub_url(self.query_url)}"
        conditional = conditional_headers(validators)

        def parse(resp):
            status = resp.status_code
            if status == 304:
                resp.close()
                if not conditional:
                    raise SourceError(f"{shown}: answered 304 Not Modified to a request that was not conditional")
                return _NotModified(validators_of(resp.headers))
            if status == 204:
                resp.close()
                raise NoDataflows("HTTP 204 No Content")
            if 200 <= status < 300:
                return self._sniffed(resp, shown)
            body = resp.raw.read(MAX_ERROR_BYTES, decode_content=True) or b""
            self.fetcher.add_bytes(len(body))
            resp.close()
            code, text = _error_of(body)
            said = f"SDMX error {code}{': ' + text if text else ''}" if code else ""
            if status == 404 and code == "100":
                raise NoDataflows(f"HTTP 404, {said}")
            if status == 413 or code in _TOO_LARGE_CODES:
                raise SdmxError(f"{shown}: the service refuses to send the whole list of dataflows in one answer "
                                f"(HTTP {status}{', ' + said if said else ''}); name fewer dataflows: give the url "
                                f"of one agency's, e.g. {self.service or self.url}/dataflow/AGENCY/all/latest", code, text)
            if status in (400, 501) and params is not None:
                raise _ParamsRefused(f"HTTP {status}{', ' + said if said else ''}")
            hint = (" (is the url the service's REST entry point, e.g. https://bdm.insee.fr/series/sdmx?)"
                    if status == 404 and not code else "")
            raise SdmxError(f"{shown}: HTTP {status} {resp.reason or ''}".rstrip()
                            + (f" ({said})" if said else "") + hint, code, text)

        headers = {"Accept": ACCEPT, **conditional}
        try:
            return self.fetcher.get(self.query_url, params=params, headers=headers, stream=True, parse=parse,
                                    what=shown)
        except _ParamsRefused as exc:
            log.warning("%s: the service refused detail=full&references=none (%s); asking without them", self.label,
                        exc)
            return self.fetcher.get(self.query_url, headers=headers, stream=True, parse=parse, what=shown)

    @staticmethod
    def _sniffed(resp, shown: str):
        """(resp, its first bytes): an HTML page (a proxy's, a maintenance page) is retried; a JSON
        body (SDMX-JSON) refused."""
        raw = resp.raw
        raw.decode_content = True
        try:
            head = raw.read(_CHUNK) or b""
        except (Urllib3Error, OSError) as exc:
            resp.close()
            raise Retryable(f"{shown}: the answer broke off at its start ({failure_text(exc)})") from None
        start = head.lstrip(b"\xef\xbb\xbf \t\r\n")[:200]
        lowered = start.lower()
        if lowered.startswith((b"<!doctype html", b"<html")) or (not start and resp.status_code == 200):
            resp.close()
            raise Retryable(f"{shown}: the answer is not an SDMX message (it begins {start[:80]!r})")
        if start.startswith((b"{", b"[")):
            resp.close()
            raise MessageRefused(f"{shown}: the answer is JSON (SDMX-JSON?): Harvester reads SDMX-ML structure "
                                 "messages (application/vnd.sdmx.structure+xml)")
        return resp, head

    # -- the listing
    def iter_pages(self, validators: dict | None = None, page_size: int = 1000) -> Iterator[list[DatasetRecord]]:
        """Pages of at most ``page_size`` records: every dataflow of the message, or nothing when the
        service answers 304 to ``validators`` or lists no dataflows."""
        self.not_modified, self.validators, self.listed, self.complete, self._done = False, {}, 0, False, False
        page_size = max(1, int(page_size or 1000))
        seen: set[str] = set()
        attempts = 0
        while True:
            attempts += 1
            try:
                got = self._get(validators)
            except NoDataflows as exc:
                log.warning("%s: the service lists no dataflows (%s): nothing is listed, and nothing removed on "
                            "such an answer", self.label, exc)
                self._done = True
                return
            if isinstance(got, _NotModified):
                self.not_modified = self._done = True
                self.validators = {**(validators or {}), **got.validators}  # (a 304 may renew them)
                log.info("%s: the dataflows did not change since the last run (304)", self.label)
                return
            resp, head = got
            try:
                yield from self._read(resp, head, page_size, seen)
            except SdmxError as exc:
                if exc.code != "100" or self.listed:
                    raise
                log.warning("%s: the service lists no dataflows (SDMX error 100%s): nothing is listed, and nothing "
                            "removed on such an answer", self.label, f": {exc.text}" if exc.text else "")
                self._done = True
                return
            except (Urllib3Error, OSError) as exc:
                if attempts > self.fetcher.max_retries:
                    raise SourceUnavailable(f"{self.label}: the message broke off after {self.listed} dataflows, "
                                            f"{attempts} times (last: {failure_text(exc)})") from exc
                log.warning("%s: the message broke off after %d dataflows (%s); asking again (try %d of %d), the "
                            "dataflows listed skipped", self.label, self.listed, failure_text(exc), attempts,
                            self.fetcher.max_retries)
                continue
            finally:
                self.fetcher.add_bytes(streamed_bytes(resp.raw))
                resp.close()
            self.validators = validators_of(resp.headers)
            self._done = True
            if self.listed:
                self.complete = True
            else:
                log.warning("%s: the message holds no dataflow: nothing is listed, and nothing removed on it",
                            self.label)
            log.info("%s: %d dataflows (SDMX-ML %s)", self.label, self.listed, self._version or "?")
            return

    def _read(self, resp, head: bytes, page_size: int, seen: set[str]) -> Iterator[list[DatasetRecord]]:
        reader = _MessageReader(self.label)
        page: list[DatasetRecord] = []
        listed_here: set[str] = set()
        chunk, carry, final = head, b"", False
        while True:
            # each character XML 1.0 forbids (&#x1;, a raw 0x1A) marked before expat sees it: one would
            # fail the whole message (sources/xml_chars.py)
            data, carry = self.forbidden.scrub_stream(chunk, carry, final)
            reader.feed(data)
            for attrs, node in reader.take():
                record = self._record(attrs, node, reader.version)
                sid = record.source_id
                if sid is not None and sid in listed_here:
                    record = failed(sid, {"id": sid}, [problem(
                        "duplicate-identifier", f"dataflow {sid} is listed twice in the message", "@id", sid)])
                elif sid is not None and sid in seen:
                    continue  # listed by an earlier try of this listing
                if sid is not None:
                    listed_here.add(sid)
                page.append(record)
                if len(page) >= page_size:
                    yield self._out(page, seen)
                    page = []
            if final:
                break
            chunk = resp.raw.read(_CHUNK)
            final = not chunk
        reader.feed(b"", final=True)
        self._version = reader.version
        if not reader.ended:
            raise MessageRefused(f"{self.label}: the message ended before its root element closed")
        if page:
            yield self._out(page, seen)

    _version: str | None = None

    def _record(self, attrs: dict, node: _Node | None, sdmx_ml: str | None) -> DatasetRecord:
        """``dataflow_record``, once characters XML 1.0 forbids were met: an identifier holding one
        fails its record (never altered), another text holding one is read with U+FFFD and warned."""
        found: list[str] = []
        if self.forbidden.met:
            agency, flow_id, _ = _identity(attrs)
            ident = f"{agency}:{flow_id}" if agency and flow_id else flow_id
            if self.forbidden.marked(ident):
                shown = self.forbidden.escaped(ident)
                return failed(shown, {"id": shown}, [forbidden_identifier(shown, self.forbidden.restore(ident)[1],
                                                                          "@id")])
            attrs = dict(attrs)
            for key, value in attrs.items():
                attrs[key], met = self.forbidden.restore(value)
                found += met
            stack = [node] if node is not None else []
            while stack:
                element = stack.pop()
                for key, value in element.attrs.items():
                    element.attrs[key], met = self.forbidden.restore(value)
                    found += met
                for n, part in enumerate(element.parts):
                    element.parts[n], met = self.forbidden.restore(part)
                    found += met
                stack.extend(element.children)
        record = dataflow_record(attrs, node, service=self.service, language=self.language, sdmx_ml=sdmx_ml,
                                 rest_v2=self.rest_v2)
        if found and record.ok:
            record = replace(record, problems=record.problems + (
                forbidden_warning(record.source_id, list(dict.fromkeys(found))),))
        return record

    def _out(self, page: list[DatasetRecord], seen: set[str]) -> list[DatasetRecord]:
        """A page as it goes out: its ids are listed (a later try of the listing skips them)."""
        seen.update(r.source_id for r in page if r.source_id is not None)
        self.listed += len(page)
        return page

    def iter_records(self, since, page_size: int, listing: Listing,
                     validators: dict | None = None) -> Iterator[list[DatasetRecord]]:
        """The Source protocol (sources/base.py): the whole list every run (structure queries have no
        modified-since filter), conditional on ``validators``; complete when the message was read to
        its end and listed at least one dataflow."""
        yield from self.iter_pages(validators, page_size)
        listing.not_modified = self.not_modified
        listing.complete = self.complete
        listing.validators = dict(self.validators)


class _NotModified:
    """A 304 answer: the validators it came with."""

    def __init__(self, validators: dict):
        self.validators = validators


class _ParamsRefused(Exception):
    """The service answered 400 / 501 to detail=full&references=none."""
