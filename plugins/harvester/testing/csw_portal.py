"""A local OGC CSW 2.0.2 server (test-only), answering KVP GETs as pycsw / GeoNetwork do.

It holds records (ISO 19139 ``gmd:MD_Metadata`` or Dublin Core ``csw:Record`` elements, taken from
the real answers in tests/data/csw/ and derived from them with ``derive``), in insertion order, and
answers:

- ``GetRecords``: ``startPosition`` (1-based) / ``maxRecords`` paging with ``numberOfRecordsMatched``,
  ``numberOfRecordsReturned`` and ``nextRecord`` (0 after the last page); an OGC Filter
  ``PropertyIsGreaterThanOrEqualTo`` on ``apiso:Modified`` / ``dct:modified`` (``constraint`` with
  ``constraintLanguage=FILTER``) compared with each record's dateStamp / dct:modified;
  ``resultType=hits`` (counts only); ``elementSetName`` summary/brief trimmed to id, date and title
  (``ignore_element_set``: full records whatever is asked);
- ``GetRecordById`` (``id``, comma-separated ids allowed; none found: a 404 ``NotFound``
  ExceptionReport, as pycsw's CSW 3 endpoint answers);
- anything else: an ``ows:ExceptionReport`` (OperationNotSupported / MissingParameterValue).

Modes for the tests: ``ignore_filter`` (the filter is dropped: every record comes back),
``reject_filter`` (a filtered request answers an ExceptionReport, as servers without the
queryable do), ``stuck_next`` (``nextRecord`` stays at the given value), ``max_page_size`` (pages
capped below ``maxRecords``), ``omit_counts`` (no ``numberOfRecordsMatched``, no ``nextRecord``), ``fail_next(n, status,
retry_after=, truncated=)``: the next ``n`` requests fail with that status (or with a body cut in
half); ``canned = (status, body)``: every request gets that answer (a saved ExceptionReport). ``requests`` lists the query parameters (lower-cased keys) of every request received.
"""
from __future__ import annotations

import copy
import threading
import xml.etree.ElementTree as ET
from datetime import datetime, timezone
from urllib.parse import parse_qsl, urlsplit

from harvester.domain.dataset import parse_timestamp
from harvester.sources.csw import NS  # the same namespaces, with the same prefixes, as the client reads
from harvester.testing.local_http import FailureQueue, LocalServer, QuietHandler

for _prefix, _uri in NS.items():
    ET.register_namespace(_prefix, _uri)
DC_RECORD = f"{{{NS['csw']}}}Record"
ISO_ROOTS = (f"{{{NS['gmd']}}}MD_Metadata", f"{{{NS['gmi']}}}MI_Metadata")


def load_records(path) -> list[ET.Element]:
    """The records of a saved GetRecords / GetRecordById answer."""
    root = ET.parse(path).getroot()
    container = root.find("csw:SearchResults", NS)
    container = root if container is None else container
    return [copy.deepcopy(e) for e in container if e.tag in ISO_ROOTS or e.tag == DC_RECORD]


def record_id(record: ET.Element) -> str:
    if record.tag == DC_RECORD:
        return (record.findtext("dc:identifier", "", NS) or "").strip()
    return (record.findtext("gmd:fileIdentifier/gco:CharacterString", "", NS) or "").strip()


def record_modified(record: ET.Element) -> datetime | None:
    if record.tag == DC_RECORD:
        value = record.findtext("dct:modified", None, NS) or record.findtext("dc:date", None, NS)
    else:
        value = (record.findtext("gmd:dateStamp/gco:DateTime", None, NS)
                 or record.findtext("gmd:dateStamp/gco:Date", None, NS))
    return parse_timestamp(value)


def derive(record: ET.Element, new_id: str, *, title: str | None = None, modified: str | None = None) -> ET.Element:
    """A copy of a real record with another identifier (and title, modification date)."""
    out = copy.deepcopy(record)
    if out.tag == DC_RECORD:
        out.find("dc:identifier", NS).text = new_id
        if title is not None:
            out.find("dc:title", NS).text = title
        if modified is not None:
            node = out.find("dct:modified", NS)
            if node is None:
                node = ET.SubElement(out, f"{{{NS['dct']}}}modified")
            node.text = modified
        return out
    out.find("gmd:fileIdentifier/gco:CharacterString", NS).text = new_id
    if title is not None:
        prop = out.find("gmd:identificationInfo/*/gmd:citation/gmd:CI_Citation/gmd:title", NS)
        prop.find("gco:CharacterString", NS).text = title
        free = prop.find("gmd:PT_FreeText", NS)
        if free is not None:
            prop.remove(free)
    if modified is not None:
        stamp = out.find("gmd:dateStamp", NS)
        for child in list(stamp):
            stamp.remove(child)
        ET.SubElement(stamp, f"{{{NS['gco']}}}DateTime").text = modified
    return out


def summary(record: ET.Element) -> ET.Element:
    """What a summary (or brief) element set keeps of a record, as far as a harvester reads it:
    the identifier, the modification date (summary only) and the title."""
    if record.tag == DC_RECORD:
        out = ET.Element(f"{{{NS['csw']}}}SummaryRecord")
        for name in ("dc:identifier", "dc:title", "dct:modified"):
            node = record.find(name, NS)
            if node is not None:
                out.append(copy.deepcopy(node))
        return out
    out = ET.Element(record.tag)
    for name in ("gmd:fileIdentifier", "gmd:dateStamp"):
        node = record.find(name, NS)
        if node is not None:
            out.append(copy.deepcopy(node))
    return out


def exception_report(code: str, text: str, locator: str | None = None) -> bytes:
    loc = f' locator="{locator}"' if locator else ""
    return (f'<?xml version="1.0" encoding="UTF-8"?>\n<ows:ExceptionReport xmlns:ows="{NS["ows"]}" version="1.2.0">'
            f'<ows:Exception exceptionCode="{code}"{loc}><ows:ExceptionText>{text}</ows:ExceptionText>'
            f"</ows:Exception></ows:ExceptionReport>").encode()


class CswServer(LocalServer):
    name = "csw-server"
    path = "/csw"

    def __init__(self, records: list[ET.Element] | None = None):
        self.records: list[ET.Element] = list(records or [])
        self.requests: list[dict[str, str]] = []
        self.ignore_filter = False
        self.reject_filter = False
        self.stuck_next: int | None = None
        self.max_page_size: int | None = None   # a page holds at most this many, whatever maxRecords asks
        self.omit_counts = False   # no numberOfRecordsMatched and no nextRecord (both optional to read)
        self.ignore_element_set = False  # answer full records whatever elementSetName asks
        self.canned: tuple[int, bytes] | None = None  # (status, body) answered to every request
        self._fail = FailureQueue()
        self._lock = threading.Lock()
        super().__init__()

    @property
    def url(self) -> str:
        return self.base_url + self.path

    # -- what the tests change
    def set_records(self, records: list[ET.Element]) -> None:
        with self._lock:
            self.records = list(records)

    def ids(self) -> list[str]:
        with self._lock:
            return [record_id(r) for r in self.records]

    def fail_next(self, n: int = 1, status: int = 503, *, retry_after: str | None = None,
                  truncated: bool = False) -> None:
        self._fail.add(n, status, retry_after, truncated)

    def getrecords_requests(self) -> list[dict[str, str]]:
        with self._lock:
            return [r for r in self.requests if r.get("request", "").lower() == "getrecords"]

    # -- answers
    def _since(self, params: dict) -> datetime | None | str:
        constraint = params.get("constraint")
        if not constraint:
            return None
        try:
            root = ET.fromstring(constraint)
        except ET.ParseError:
            return "bad"
        op = root.find("ogc:PropertyIsGreaterThanOrEqualTo", NS)
        if op is None:
            return "bad"
        prop = (op.findtext("ogc:PropertyName", "", NS) or "").strip().lower()
        if prop not in ("apiso:modified", "dct:modified", "modified"):
            return "bad"
        return parse_timestamp((op.findtext("ogc:Literal", "", NS) or "").strip()) or "bad"

    def answer(self, params: dict) -> tuple[int, bytes]:
        request = params.get("request", "").lower()
        if params.get("service", "").upper() != "CSW":
            return 400, exception_report("MissingParameterValue", "Missing or invalid service parameter", "service")
        with self._lock:
            records = list(self.records)
        if request == "getrecordbyid":
            wanted = [i.strip() for i in params.get("id", "").split(",") if i.strip()]
            if not wanted:
                return 400, exception_report("MissingParameterValue", "Missing id parameter", "id")
            found = [r for r in records if record_id(r) in wanted]
            if not found:
                return 404, exception_report("NotFound", f"No records found for {','.join(wanted)}", "id")
            inner = "".join(ET.tostring(r, encoding="unicode") for r in found)
            return 200, (f'<?xml version="1.0" encoding="UTF-8"?>\n<csw:GetRecordByIdResponse xmlns:csw="{NS["csw"]}">'
                         f"{inner}</csw:GetRecordByIdResponse>").encode()
        if request != "getrecords":
            return 400, exception_report("OperationNotSupported", f"Invalid request {request!r}", "request")
        since = self._since(params)
        if since is not None and self.reject_filter:
            return 200, exception_report("InvalidParameterValue", "Invalid Filter query: unknown queryable Modified",
                                         "constraint")
        if since == "bad":
            return 200, exception_report("InvalidParameterValue", "Invalid Filter query", "constraint")
        if isinstance(since, datetime) and not self.ignore_filter:
            records = [r for r in records if (record_modified(r) or datetime.min.replace(tzinfo=timezone.utc)) >= since]
        try:
            start = int(params.get("startposition", "1"))
            max_records = int(params.get("maxrecords", "10"))
        except ValueError:
            return 400, exception_report("InvalidParameterValue", "startPosition and maxRecords must be integers")
        hits = params.get("resulttype", "results").lower() == "hits"
        if self.max_page_size is not None:
            max_records = min(max_records, self.max_page_size)
        page = [] if hits else records[max(start, 1) - 1:max(start, 1) - 1 + max_records]
        nxt = start + len(page) if start + len(page) <= len(records) else 0
        element_set = params.get("elementsetname", "summary").lower()
        if self.ignore_element_set:
            element_set = "full"
        if element_set != "full":
            page = [summary(r) for r in page]
        if self.stuck_next is not None:
            nxt = self.stuck_next
        inner = "".join(ET.tostring(r, encoding="unicode") for r in page)
        schema = params.get("outputschema", NS["csw"])
        counts = (f'numberOfRecordsReturned="{len(page)}"' if self.omit_counts else
                  f'numberOfRecordsMatched="{len(records)}" numberOfRecordsReturned="{len(page)}" nextRecord="{nxt}"')
        return 200, (
            f'<?xml version="1.0" encoding="UTF-8"?>\n<csw:GetRecordsResponse xmlns:csw="{NS["csw"]}" version="2.0.2">'
            f'<csw:SearchStatus timestamp="2026-01-01T00:00:00Z"/>'
            f'<csw:SearchResults {counts} '
            f'recordSchema="{schema}" elementSet="{element_set}">{inner}</csw:SearchResults>'
            f"</csw:GetRecordsResponse>").encode()

    def _handler(self):
        server = self

        class Handler(QuietHandler):
            content_type = "application/xml; charset=UTF-8"

            def do_GET(self):
                parts = urlsplit(self.path)
                params = {k.lower(): v for k, v in parse_qsl(parts.query, keep_blank_values=True)}
                with server._lock:
                    server.requests.append(params)
                if parts.path != server.path:
                    self.send_response(404)
                    self.send_header("Content-Type", "text/html")
                    self.send_header("Content-Length", "9")
                    self.end_headers()
                    self.wfile.write(b"not found")
                    return
                failure = server._fail.take()
                status, body = server.canned or server.answer(params)
                if failure:
                    fail_status, retry_after, truncated = failure
                    if truncated:  # the connection closes halfway through the promised body
                        self.close_connection = True
                        self._send(200, body[:len(body) // 2], length=len(body))
                        return
                    extra = {"Retry-After": retry_after} if retry_after is not None else {}
                    self._send(fail_status, b"<html><body>Service Unavailable</body></html>", extra)
                    return
                self._send(status, body)

        return Handler
