"""A local OAI-PMH 2.0 repository (test-only), answering as Zenodo's does (../shared/portal-samples/oai-pmh/).

It holds records (an identifier, a datestamp, setSpecs, a deleted flag, and metadata per prefix:
the ``oai_dc:dc`` / DataCite ``resource`` elements of Zenodo's real answers, derived with
``derive``) and answers the six verbs it needs:

- ``Identify`` (``granularity`` seconds or days, ``deletedRecord`` persistent);
- ``ListRecords`` / ``ListIdentifiers``: ``metadataPrefix`` (oai_dc, datacite, else
  ``cannotDisseminateFormat``), ``from``/``until`` inclusive in the granularity (another format:
  ``badArgument``), ``set``; the records available in that format, in (datestamp, identifier) order (``unordered``: by identifier
  only, as Zenodo's pages are); the server's page size (``page_size``, 100 as Zenodo's); an
  incomplete list ends with a ``resumptionToken`` (``cursor``, ``completeListSize``,
  ``expirationDate``), the last page with an empty one; a token is exclusive (any other argument
  with it: ``badArgument``) and expires after ``token_ttl`` seconds, or on demand
  (``expire_tokens(n)``: the next ``n`` token requests answer ``badResumptionToken``); nothing
  matched: ``noRecordsMatch``;
- ``GetRecord`` (``idDoesNotExist``);
- errors as ``<error code=...>`` bodies with HTTP ``error_status`` (422, as Zenodo; 200 is the protocol's).

Deleted records come as headers with ``status="deleted"`` (with their metadata when
``deleted_metadata``, as Zenodo's page 1 shows). Misbehaviour for the tests: ``fail_next(n, status,
retry_after=)``, ``loop_token`` (every page's token is the same one), ``endless`` (a ListRecords
answer that never ends), ``canned = (status, body)``. ``requests`` lists every request's parameters.

``bench_catalogue(n)``: n records derived from the real Zenodo ones, for bench/sources_bench.py.
"""
from __future__ import annotations

import copy
import secrets
import threading
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from urllib.parse import parse_qsl, urlsplit
from xml.sax.saxutils import escape

from harvester.testing.local_http import FailureQueue, LocalServer, QuietHandler
from harvester.testing.samples import portal_sample

OAI = "http://www.openarchives.org/OAI/2.0/"
DC = "http://purl.org/dc/elements/1.1/"
OAI_DC = "http://www.openarchives.org/OAI/2.0/oai_dc/"
DATACITE = "http://datacite.org/schema/kernel-4"
NS = {"oai": OAI, "dc": DC, "oai_dc": OAI_DC, "datacite": DATACITE}
for _prefix, _uri in (("dc", DC), ("oai_dc", OAI_DC), ("datacite", DATACITE),
                      ("xsi", "http://www.w3.org/2001/XMLSchema-instance")):
    ET.register_namespace(_prefix, _uri)
SECONDS, DAY = "YYYY-MM-DDThh:mm:ssZ", "YYYY-MM-DD"
ORIGINALS = {"oai_dc": ["zenodo-listrecords-oai_dc-page1-2024-01-18.body.xml",
                        "zenodo-listrecords-oai_dc-page2-resumptiontoken-2024-01-18.body.xml",
                        "zenodo-listrecords-oai_dc-from-until-2024-01-18.body.xml"],
             "datacite": ["zenodo-listrecords-datacite-page1-2024-01-18.body.xml"]}


@dataclass
class OaiRecord:
    identifier: str
    datestamp: datetime
    metadata: dict[str, ET.Element] = field(default_factory=dict)  # prefix -> its metadata element
    sets: list[str] = field(default_factory=list)
    deleted: bool = False


def stamp(when: datetime) -> str:
    return when.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse_stamp(value: str) -> datetime:
    return datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)


def real_records() -> list[OaiRecord]:
    """Zenodo's recorded records (9 distinct in oai_dc, 3 of them in datacite too), by identifier,
    as the samples have them (page 1's deleted header included)."""
    records: dict[str, OaiRecord] = {}
    for prefix, names in ORIGINALS.items():
        for name in names:
            root = ET.parse(portal_sample("oai-pmh", name)).getroot()
            for element in root.iterfind("oai:ListRecords/oai:record", NS):
                header = element.find("oai:header", NS)
                identifier = header.findtext("oai:identifier", "", NS).strip()
                rec = records.setdefault(identifier, OaiRecord(
                    identifier, _parse_stamp(header.findtext("oai:datestamp", "", NS).strip()),
                    sets=[s.text.strip() for s in header.iterfind("oai:setSpec", NS)],
                    deleted=header.get("status") == "deleted"))
                metadata = element.find("oai:metadata", NS)
                if metadata is not None and len(metadata):
                    rec.metadata[prefix] = copy.deepcopy(metadata[0])
    return list(records.values())


def derive(record: OaiRecord, identifier: str, *, title: str | None = None, datestamp: datetime | None = None,
           deleted: bool = False) -> OaiRecord:
    """A copy of a real record under another identifier (and title, datestamp)."""
    out = OaiRecord(identifier, datestamp or record.datestamp, {}, list(record.sets), deleted)
    for prefix, element in record.metadata.items():
        element = copy.deepcopy(element)
        if prefix == "oai_dc":
            for node in element.iterfind("dc:identifier", NS):
                if node.text and node.text.strip() == record.identifier:
                    node.text = identifier
            if title is not None:
                element.find("dc:title", NS).text = title
        else:
            for node in element.iterfind("datacite:alternateIdentifiers/datacite:alternateIdentifier", NS):
                node.text = identifier
            if title is not None:
                element.find("datacite:titles/datacite:title", NS).text = title
        out.metadata[prefix] = element
    return out


def catalogue(n: int, start: datetime, *, step: timedelta = timedelta(minutes=1), prefix: str = "oai:local") \
        -> list[OaiRecord]:
    """``n`` live records derived from the real ones (the ones with metadata, deleted header or not):
    ``<prefix>:<i>``, titles numbered, datestamps ``step`` apart from ``start``."""
    bases = [r for r in real_records() if "oai_dc" in r.metadata]
    titles = [b.metadata["oai_dc"].findtext("dc:title", "", NS) for b in bases]
    return [derive(bases[i % len(bases)], f"{prefix}:{i}", title=f"{titles[i % len(bases)]} #{i}",
                   datestamp=start + i * step) for i in range(n)]


def error_body(code: str, text: str = "") -> bytes:
    """An OAI-PMH error answer as Zenodo writes it (no XML declaration, a stylesheet instruction)."""
    return (f'<?xml-stylesheet type="text/xsl" href="/static/oai2.xsl"?><OAI-PMH xmlns="{OAI}">'
            f"<responseDate>{stamp(datetime.now(timezone.utc))}</responseDate><request>https://local/oai2d</request>"
            f'<error code="{code}">{escape(text)}</error></OAI-PMH>').encode()


def bomb_body(levels: int = 8, fan: int = 10) -> bytes:
    """A ListRecords answer whose title is an entity expanding to ``fan ** levels`` characters."""
    entities = ['<!ENTITY e0 "x">'] + [f'<!ENTITY e{n} "{("&e%d;" % (n - 1)) * fan}">' for n in range(1, levels + 1)]
    return (f'<?xml version="1.0"?><!DOCTYPE OAI-PMH [{"".join(entities)}]><OAI-PMH xmlns="{OAI}"><ListRecords>'
            f"<record><header><identifier>oai:bomb:1</identifier><datestamp>2024-01-01T00:00:00Z</datestamp></header>"
            f'<metadata><oai_dc:dc xmlns:oai_dc="{OAI_DC}" xmlns:dc="{DC}"><dc:title>&e{levels};</dc:title>'
            f"</oai_dc:dc></metadata></record></ListRecords></OAI-PMH>").encode()


class OaiPmhServer(LocalServer):
    name = "oai-pmh-server"
    path = "/oai2d"

    def __init__(self, records: list[OaiRecord] | None = None, *, page_size: int = 100, granularity: str = SECONDS):
        self.records: list[OaiRecord] = list(records or [])
        self.page_size, self.granularity = page_size, granularity
        self.error_status = 422
        self.token_ttl: float | None = 120.0  # Zenodo's tokens expire two minutes after the answer
        self.unordered = False
        self.deleted_metadata = False
        self.loop_token = False
        self.endless = False
        self.canned: tuple[int, bytes] | None = None
        self.requests: list[dict[str, str]] = []
        self._tokens: dict[str, tuple[dict, int, float]] = {}
        self._expire = 0
        self._fail = FailureQueue()
        self._lock = threading.Lock()
        super().__init__()

    @property
    def url(self) -> str:
        return self.base_url + self.path

    # -- what the tests change
    def set_records(self, records: list[OaiRecord]) -> None:
        with self._lock:
            self.records = list(records)

    def put(self, record: OaiRecord) -> None:
        """Add or replace (by identifier) a record."""
        with self._lock:
            self.records = [r for r in self.records if r.identifier != record.identifier] + [record]

    def delete(self, identifier: str, when: datetime) -> None:
        """The record becomes a deleted header with datestamp ``when`` (deletedRecord persistent)."""
        with self._lock:
            for r in self.records:
                if r.identifier == identifier:
                    r.deleted, r.datestamp = True, when

    def expire_tokens(self, n: int = 1) -> None:
        """The next ``n`` requests with a resumption token answer badResumptionToken."""
        with self._lock:
            self._expire += n

    def fail_next(self, n: int = 1, status: int = 503, *, retry_after: str | None = None) -> None:
        self._fail.add(n, status, retry_after)

    def verb_requests(self, verb: str | None = None) -> list[dict[str, str]]:
        with self._lock:
            return [r for r in self.requests if verb is None or r.get("verb") == verb]

    # -- answers
    def _error(self, code: str, text: str = "") -> tuple[int, bytes]:
        return self.error_status, error_body(code, text)

    def _envelope(self, request: dict, inner: str) -> bytes:
        attrs = "".join(f' {k}="{escape(v)}"' for k, v in sorted(request.items()) if k != "resumptionToken")
        return (f"<?xml version='1.0' encoding='UTF-8'?>\n"
                f'<?xml-stylesheet type="text/xsl" href="/static/oai2.xsl"?>\n'
                f'<OAI-PMH xmlns="{OAI}" xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance">'
                f"<responseDate>{stamp(datetime.now(timezone.utc))}</responseDate>"
                f"<request{attrs}>https://local/oai2d</request>{inner}</OAI-PMH>").encode()

    def _bound(self, value: str | None, end: bool) -> datetime | None | str:
        if value is None:
            return None
        try:
            if self.granularity == DAY or len(value) == 10:
                day = datetime.strptime(value, "%Y-%m-%d").replace(tzinfo=timezone.utc)
                return day + timedelta(days=1, microseconds=-1) if end else day
            if self.granularity == SECONDS:
                return _parse_stamp(value)
        except ValueError:
            pass
        return "bad"

    def _header(self, r: OaiRecord) -> str:
        status = ' status="deleted"' if r.deleted else ""
        sets = "".join(f"<setSpec>{escape(s)}</setSpec>" for s in r.sets)
        when = r.datestamp.strftime("%Y-%m-%d") if self.granularity == DAY else stamp(r.datestamp)
        return f"<header{status}><identifier>{escape(r.identifier)}</identifier><datestamp>{when}</datestamp>{sets}</header>"

    def _record(self, r: OaiRecord, prefix: str) -> str:
        metadata = ""
        if (not r.deleted or self.deleted_metadata) and prefix in r.metadata:
            metadata = f"<metadata>{ET.tostring(r.metadata[prefix], encoding='unicode')}</metadata>"
        return f"<record>{self._header(r)}{metadata}</record>"

    def answer(self, params: dict) -> tuple[int, bytes]:
        verb = params.get("verb")
        if verb == "Identify":
            return 200, self._envelope(params, (
                "<Identify><repositoryName>Local</repositoryName><baseURL>https://local/oai2d</baseURL>"
                "<protocolVersion>2.0</protocolVersion><adminEmail>info@local</adminEmail>"
                "<earliestDatestamp>2014-02-03T14:41:33Z</earliestDatestamp><deletedRecord>persistent</deletedRecord>"
                f"<granularity>{self.granularity}</granularity></Identify>"))
        if verb == "GetRecord":
            prefix, identifier = params.get("metadataPrefix"), params.get("identifier")
            if not prefix or not identifier:
                return self._error("badArgument", "GetRecord needs identifier and metadataPrefix")
            if prefix not in ("oai_dc", "datacite"):
                return self._error("cannotDisseminateFormat", prefix)
            with self._lock:
                found = next((r for r in self.records if r.identifier == identifier), None)
            if found is None:
                return self._error("idDoesNotExist", f"No matching identifier {identifier}")
            if not found.deleted and prefix not in found.metadata:
                return self._error("cannotDisseminateFormat", f"{identifier} is not available as {prefix}")
            return 200, self._envelope(params, f"<GetRecord>{self._record(found, prefix)}</GetRecord>")
        if verb not in ("ListRecords", "ListIdentifiers"):
            return self._error("badVerb", f"Illegal OAI verb {verb!r}")
        if "resumptionToken" in params:
            if set(params) - {"verb", "resumptionToken"}:
                return self._error("badArgument", "resumptionToken is an exclusive argument")
            with self._lock:
                found = self._tokens.get(params["resumptionToken"])
                forced = self._expire > 0
                self._expire -= 1 if forced else 0
            if found is None or forced or (self.token_ttl is not None and time.monotonic() - found[2] > self.token_ttl):
                return self._error("badResumptionToken", "The value of the resumptionToken argument is invalid or "
                                                         "expired.")
            args, offset, _ = found
        else:
            args, offset = params, 0
        prefix = args.get("metadataPrefix")
        if not prefix:
            return self._error("badArgument", "metadataPrefix is required")
        if prefix not in ("oai_dc", "datacite"):
            return self._error("cannotDisseminateFormat", prefix)
        since, until = self._bound(args.get("from"), False), self._bound(args.get("until"), True)
        if "bad" in (since, until):
            return self._error("badArgument", "from and until must be in the repository's granularity")
        with self._lock:
            records = list(self.records)
        matched = [r for r in records if (since is None or r.datestamp >= since) and (until is None or r.datestamp <= until)
                   and (not args.get("set") or args["set"] in r.sets) and (r.deleted or prefix in r.metadata)]
        matched.sort(key=(lambda r: r.identifier) if self.unordered else (lambda r: (r.datestamp, r.identifier)))
        page = matched[offset:offset + self.page_size]
        if not page and offset == 0:
            return self._error("noRecordsMatch")
        items = "".join(self._header(r) if verb == "ListIdentifiers" else self._record(r, prefix) for r in page)
        token = ""
        if offset + len(page) < len(matched):
            token = "loop" if self.loop_token else secrets.token_urlsafe(24)
            with self._lock:
                self._tokens[token] = (dict(args), offset + len(page), time.monotonic())
            expires = stamp(datetime.now(timezone.utc) + timedelta(seconds=self.token_ttl or 86400))
            items += (f'<resumptionToken expirationDate="{expires}" cursor="{offset}" '
                      f'completeListSize="{len(matched)}">{token}</resumptionToken>')
        elif offset:
            items += f'<resumptionToken cursor="{offset}" completeListSize="{len(matched)}"/>'
        return 200, self._envelope(args if offset == 0 else params, f"<{verb}>{items}</{verb}>")

    def _handler(self):
        server = self

        class Handler(QuietHandler):
            content_type = "text/xml; charset=utf-8"

            def do_GET(self):
                parts = urlsplit(self.path)
                params = dict(parse_qsl(parts.query, keep_blank_values=True))
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
                if failure:
                    status, retry_after = failure
                    extra = {"Retry-After": retry_after} if retry_after is not None else {}
                    self._send(status, b"<html><body>Service Unavailable</body></html>", extra)
                    return
                if server.endless and params.get("verb") == "ListRecords":
                    self._endless()
                    return
                status, body = server.canned or server.answer(params)
                self._send(status, body)

            def _endless(self):
                """A ListRecords answer whose records never end (until the client goes or 4 GB)."""
                self.send_response(200)
                self.send_header("Content-Type", self.content_type)
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                start = server._envelope({"verb": "ListRecords"}, "<ListRecords>").replace(b"</OAI-PMH>", b"")
                chunk = (b"<record><header><identifier>oai:endless</identifier><datestamp>2024-01-01T00:00:00Z"
                         b"</datestamp></header></record>") * 500
                try:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(start), start))
                    sent = 0
                    while sent < 4 << 30:
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                        sent += len(chunk)
                except (BrokenPipeError, ConnectionResetError, OSError):
                    pass
                self.close_connection = True

        return Handler


def bench_catalogue(n: int):
    """(an unstarted server of ``n`` records derived from Zenodo's, a function giving its base URL
    once it runs): distinct datestamps in 2024, a minute apart; Zenodo's page size (100)."""
    server = OaiPmhServer(catalogue(n, datetime(2024, 1, 1, tzinfo=timezone.utc), prefix="oai:bench"))
    return server, lambda: server.url
