"""A local SDMX 2.1 REST service (test-only), answering structure queries for dataflows as the
sdmx-rest specification (sdmx-twg/sdmx-rest v2_1/ws/rest/docs, 4_3 structural queries, 4_8 errors)
and the recorded answers of ../shared/portal-samples/sdmx/ have it.

It holds dataflows (``Dataflow`` elements taken from real messages with ``load_dataflows``, and
derived from them with ``derive``) and answers ``GET {url}/dataflow[/{agencyID}[/{resourceID}[/{version}]]]``:

- ``all`` (agency, id, version) and ``latest`` (version, the default) keywords, several values
  joined with ``+``; ``latest`` is the highest version of each agency:id;
- ``detail``: ``full`` (default), ``allstubs`` (identification and names only), ``allcompletestubs``
  (names, descriptions, annotations, no structure reference), the ``reference*`` values (as full:
  no referenced artefacts are held); ``references``: ``none`` (default) and the other standard
  values (nothing referenced is held: the same message). Any other value: 400 with SDMX error 140;
- one SDMX-ML 2.1 structure message (prefixes ``mes``/``str``/``com``), no paging, no count;
- nothing matching (an empty catalogue too): 404 with SDMX error 100 "No Results Found";
  ``empty_as_204``: 204 instead (the newer sdmx-rest's "empty but still healthy state");
- a message over ``max_message_bytes``: 413 with SDMX error 510 "Response size exceeds service limit";
- conditional requests (``conditional``, on by default): ``ETag`` (of the message) and
  ``Last-Modified`` (when the dataflows last changed), ``If-None-Match`` / ``If-Modified-Since``
  answered 304;
- ``documents``: a path answered with bytes as they are (a real recorded message, with its own
  prefixes and SDMX-ML version), with the same validators.

Misbehaviour for the tests: ``fail_next(n, status, retry_after=, truncated=)`` (the next ``n``
requests fail with that status, or with the message cut in half), ``reject_params`` (any query
string is a 400, SDMX error 140: a service that does not take ``detail``/``references``),
``canned = (status, body, content_type)`` (every request gets that answer: an HTML page, a hostile
document). ``requests`` lists (path, query parameters, headers) of every request.

``bench_catalogue(n)``: a service of ``n`` dataflows derived from INSEE's 663 real ones (new ids,
numbered names in French and English, distinct UPDATE_DATA times in 2024).
"""
from __future__ import annotations

import copy
import email.utils
import hashlib
import threading
import xml.etree.ElementTree as ET
from datetime import datetime, timedelta, timezone
from urllib.parse import parse_qsl, unquote, urlsplit

from harvester.testing.local_http import FailureQueue, LocalServer, QuietHandler
from harvester.testing.samples import portal_sample

V21 = "http://www.sdmx.org/resources/sdmxml/schemas/v2_1"
NS = {"mes": f"{V21}/message", "str": f"{V21}/structure", "com": f"{V21}/common"}
XML_LANG = "{http://www.w3.org/XML/1998/namespace}lang"
DATAFLOW = f"{{{NS['str']}}}Dataflow"
INSEE = "dataflow-all-insee-bdm-fr-en-2015-12-23.xml"
DETAILS = ("full", "allstubs", "referencestubs", "allcompletestubs", "referencecompletestubs", "referencepartial")
REFERENCES = ("none", "parents", "parentsandsiblings", "children", "descendants", "all", "datastructure",
              "codelist", "conceptscheme", "categorisation", "categoryscheme", "contentconstraint")
for _prefix, _uri in NS.items():
    ET.register_namespace(_prefix, _uri)


def load_dataflows(path) -> list[ET.Element]:
    """The ``Dataflow`` elements of a saved structure message (any SDMX-ML version's namespace)."""
    root = ET.parse(path).getroot()
    return [copy.deepcopy(e) for e in root.iter() if e.tag.endswith("}Dataflow")]


def insee_dataflows() -> list[ET.Element]:
    """INSEE's 663 real dataflows (names in French and English)."""
    return load_dataflows(portal_sample("sdmx", INSEE))


def key(flow: ET.Element) -> str:
    """``agencyID:id``, the source's identity of a dataflow."""
    return f"{flow.get('agencyID')}:{flow.get('id')}"


def _urn(agency: str, flow_id: str, version: str) -> str:
    return f"urn:sdmx:org.sdmx.infomodel.datastructure.Dataflow={agency}:{flow_id}({version})"


def derive(flow: ET.Element, new_id: str | None = None, *, version: str | None = None,
           names: dict[str, str] | None = None, updated: str | None = None, agency: str | None = None) -> ET.Element:
    """A copy of a real dataflow with another id, version, agency, names ({lang: text}, replacing
    them) or UPDATE_DATA annotation (an ISO time, written as Eurostat writes it)."""
    out = copy.deepcopy(flow)
    ns = flow.tag[1:].partition("}")[0].rsplit("/", 1)[0]
    if new_id is not None:
        out.set("id", new_id)
    if agency is not None:
        out.set("agencyID", agency)
    if version is not None:
        out.set("version", version)
    out.set("urn", _urn(out.get("agencyID"), out.get("id"), out.get("version", "1.0")))
    com = f"{{{ns}/common}}"
    if names is not None:
        for old in out.findall(f"{com}Name"):
            out.remove(old)
        at = 1 if out.find(f"{com}Annotations") is not None else 0
        for n, (lang, text) in enumerate(names.items()):
            name = ET.Element(f"{com}Name", {XML_LANG: lang})
            name.text = text
            out.insert(at + n, name)
    if updated is not None:
        annotations = out.find(f"{com}Annotations")
        if annotations is None:
            annotations = ET.Element(f"{com}Annotations")
            out.insert(0, annotations)
        for a in list(annotations):
            if a.findtext(f"{com}AnnotationType") == "UPDATE_DATA":
                annotations.remove(a)
        a = ET.SubElement(annotations, f"{com}Annotation")
        ET.SubElement(a, f"{com}AnnotationTitle").text = updated
        ET.SubElement(a, f"{com}AnnotationType").text = "UPDATE_DATA"
    return out


def _version_key(version: str) -> tuple:
    return tuple(int(p) if p.isdigit() else 0 for p in (version or "0").split("."))


def error_message(code: int, text: str) -> bytes:
    """An SDMX-ML 2.1 error message, as INSEE's service writes one."""
    return (f'<?xml version="1.0" encoding="UTF-8"?><mes:Error xmlns:mes="{NS["mes"]}" xmlns:com="{NS["com"]}">'
            f'<mes:ErrorMessage code="{code}"><com:Text>{text}</com:Text></mes:ErrorMessage></mes:Error>').encode()


def _stub(flow: ET.Element, complete: bool) -> ET.Element:
    out = ET.Element(flow.tag, flow.attrib)
    keep = ("Name", "Description", "Annotations") if complete else ("Name",)
    for child in flow:
        if child.tag.rpartition("}")[2] in keep:
            out.append(copy.deepcopy(child))
    return out


def http_date(when: datetime) -> str:
    return email.utils.format_datetime(when.astimezone(timezone.utc), usegmt=True)


class SdmxServer(LocalServer):
    name = "sdmx-server"
    path = "/rest"

    def __init__(self, dataflows: list[ET.Element] | None = None):
        self.dataflows: list[ET.Element] = list(dataflows or [])
        self.documents: dict[str, bytes] = {}
        self.requests: list[tuple[str, dict, dict]] = []
        self.conditional = True
        self.empty_as_204 = False
        self.reject_params = False
        self.max_message_bytes: int | None = None
        self.canned: tuple[int, bytes, str] | None = None
        self.changed_at = datetime(2026, 1, 1, tzinfo=timezone.utc)
        self._cache: dict[tuple, bytes] = {}
        self._fail = FailureQueue()
        self._lock = threading.Lock()
        super().__init__()

    @property
    def url(self) -> str:
        """The service's REST entry point (what portals.yaml's url names)."""
        return self.base_url + self.path

    # -- what the tests change
    def set_dataflows(self, dataflows: list[ET.Element]) -> None:
        """Serve these from now on; Last-Modified moves (one second later than before, at least)."""
        with self._lock:
            self.dataflows = list(dataflows)
            self._cache.clear()
            self.changed_at = max(self.changed_at + timedelta(seconds=1),
                                  datetime.now(timezone.utc).replace(microsecond=0))

    def keys(self) -> list[str]:
        with self._lock:
            return [key(f) for f in self.dataflows]

    def fail_next(self, n: int = 1, status: int = 503, *, retry_after: str | None = None,
                  truncated: bool = False) -> None:
        self._fail.add(n, status, retry_after, truncated)

    def dataflow_requests(self) -> list[tuple[str, dict, dict]]:
        with self._lock:
            return [r for r in self.requests if "/dataflow" in r[0]]

    # -- answers
    def _select(self, parts: list[str]) -> list[ET.Element]:
        agency, flow_id, version = (parts + ["all", "all", "latest"][len(parts):])[:3]
        agencies = None if agency == "all" else set(agency.split("+"))
        ids = None if flow_id == "all" else set(flow_id.split("+"))
        with self._lock:
            flows = [f for f in self.dataflows if (agencies is None or f.get("agencyID") in agencies)
                     and (ids is None or f.get("id") in ids)]
        if version == "all":
            return flows
        if version == "latest":
            best: dict[str, ET.Element] = {}
            for f in flows:
                k = key(f)
                if k not in best or _version_key(f.get("version")) > _version_key(best[k].get("version")):
                    best[k] = f
            return [f for f in flows if best[key(f)] is f]
        versions = set(version.split("+"))
        return [f for f in flows if f.get("version") in versions]

    def message(self, flows: list[ET.Element], detail: str = "full") -> bytes:
        root = ET.Element(f"{{{NS['mes']}}}Structure")
        header = ET.SubElement(root, f"{{{NS['mes']}}}Header")
        ET.SubElement(header, f"{{{NS['mes']}}}ID").text = "IREF000001"
        ET.SubElement(header, f"{{{NS['mes']}}}Test").text = "false"
        ET.SubElement(header, f"{{{NS['mes']}}}Prepared").text = self.changed_at.strftime("%Y-%m-%dT%H:%M:%S")
        ET.SubElement(header, f"{{{NS['mes']}}}Sender", {"id": "LOCAL"})
        container = ET.SubElement(ET.SubElement(root, f"{{{NS['mes']}}}Structures"), f"{{{NS['str']}}}Dataflows")
        for flow in flows:
            container.append(_stub(flow, detail == "allcompletestubs") if detail.startswith("all") and
                             detail.endswith("stubs") else flow)
        return b'<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="utf-8", xml_declaration=False)

    def answer(self, path: str, params: dict, headers: dict) -> tuple[int, bytes, dict]:
        """(status, body, extra headers) of a GET (no failure injected)."""
        if self.canned is not None:
            status, body, content_type = self.canned
            return status, body, {"Content-Type": content_type}
        if path in self.documents:
            return self._conditional(self.documents[path], headers)
        if not path.startswith(self.path + "/dataflow"):
            return 404, error_message(100, f"No Results Found: no resource at {path}"), {}
        if self.reject_params and params:
            return 400, error_message(140, "Syntax error: query parameters are not supported"), {}
        detail = params.get("detail", "full")
        references = params.get("references", "none")
        if detail not in DETAILS:
            return 400, error_message(140, f"Syntax error: detail={detail} is not one of {', '.join(DETAILS)}"), {}
        if references not in REFERENCES:
            return 400, error_message(140, f"Syntax error: references={references} is not valid"), {}
        parts = [unquote(p) for p in path[len(self.path + "/dataflow"):].strip("/").split("/") if p]
        cache_key = (tuple(parts), detail)
        with self._lock:
            body = self._cache.get(cache_key)
        if body is None:
            flows = self._select(parts)
            if not flows:
                if self.empty_as_204:
                    return 204, b"", {}
                return 404, error_message(100, "No Results Found"), {}
            body = self.message(flows, detail)
            with self._lock:
                self._cache[cache_key] = body
        if self.max_message_bytes is not None and len(body) > self.max_message_bytes:
            return 413, error_message(510, "Response size exceeds service limit"), {}
        return self._conditional(body, headers)

    def _conditional(self, body: bytes, headers: dict) -> tuple[int, bytes, dict]:
        if not self.conditional:
            return 200, body, {}
        etag = '"' + hashlib.sha256(body).hexdigest()[:32] + '"'
        extra = {"ETag": etag, "Last-Modified": http_date(self.changed_at)}
        match = headers.get("if-none-match")
        if match is not None:
            if etag in [m.strip() for m in match.split(",")] or match.strip() == "*":
                return 304, b"", extra
        else:
            since = headers.get("if-modified-since")
            try:
                when = email.utils.parsedate_to_datetime(since) if since else None
            except (TypeError, ValueError):
                when = None
            if when is not None and self.changed_at <= when:
                return 304, b"", extra
        return 200, body, extra

    def _handler(self):
        server = self

        class Handler(QuietHandler):
            content_type = "application/vnd.sdmx.structure+xml; version=2.1; charset=utf-8"

            def do_GET(self):
                parts = urlsplit(self.path)
                params = dict(parse_qsl(parts.query, keep_blank_values=True))
                headers = {k.lower(): v for k, v in self.headers.items()}
                with server._lock:
                    server.requests.append((parts.path, params, headers))
                failure = server._fail.take()
                status, body, extra = server.answer(parts.path, params, headers)
                if failure:
                    fail_status, retry_after, truncated = failure
                    if truncated:  # the connection closes halfway through the promised body
                        self.close_connection = True
                        self._send(200, body[:len(body) // 2], extra, length=len(body))
                        return
                    more = {"Retry-After": retry_after} if retry_after is not None else {}
                    self._html(fail_status, b"<html><body>Service Unavailable</body></html>", more)
                    return
                if status in (204, 304):
                    self.send_response(status)
                    for k, v in extra.items():
                        self.send_header(k, v)
                    self.end_headers()
                    return
                if "Content-Type" in extra:
                    self.content_type = extra.pop("Content-Type")
                elif status >= 400:
                    self.content_type = "application/xml; charset=utf-8"
                self._send(status, body, extra)

            def _html(self, status, body, extra):
                self.content_type = "text/html"
                self._send(status, body, extra)

        return Handler


def bench_catalogue(n: int):
    """(an unstarted server of ``n`` dataflows derived from INSEE's real ones, the URL to harvest)."""
    bases = insee_dataflows()
    start = datetime(2024, 1, 1, tzinfo=timezone.utc)
    flows = []
    for i in range(n):
        base = bases[i % len(bases)]
        fr = base.findtext(f"{{{NS['com']}}}Name[@{XML_LANG}='fr']") or base.get("id")
        en = base.findtext(f"{{{NS['com']}}}Name[@{XML_LANG}='en']") or base.get("id")
        when = (start + timedelta(minutes=i)).strftime("%Y-%m-%dT%H:%M:%S+0100")
        flows.append(derive(base, f"BENCH-{i:06d}", names={"fr": f"{fr} ({i})", "en": f"{en} ({i})"}, updated=when))
    server = SdmxServer(flows)
    return server, lambda: server.url
