"""OAI-PMH 2.0 repositories (``type: oai-pmh``): Zenodo, Dataverse, DSpace, EPrints, ckanext-oaipmh...

The portal's ``url`` is the repository's base URL (``https://zenodo.org/oai2d``). Records are
listed with ``verb=ListRecords&metadataPrefix=<oai_metadata_prefix>`` (``oai_dc`` by default,
``datacite`` / ``oai_datacite``), limited to ``set=<oai_set>`` when portals.yaml names one. The
repository chooses the page size (Zenodo: 100); a page that is not the last ends with a
``resumptionToken``, and the next page is asked with the verb and that token only (the token is an
exclusive argument, protocol section 3.5). The list is complete when the last answer has an empty
or no ``resumptionToken``: that is the only proof of completeness. ``completeListSize`` is optional
and an estimate on some servers, so the kind's count is ``absent`` (it only feeds progress lines).

Incremental: ``from=<since>`` on the record's datestamp, inclusive, in the granularity Identify
announces (``YYYY-MM-DD`` or ``YYYY-MM-DDThh:mm:ssZ``; Identify is asked only when a ``from`` must
be written). ``noRecordsMatch`` is an empty result, not an error.

An expired or unknown token (``badResumptionToken``) restarts the listing with ``from`` = the
datestamp of the last record read (not from the beginning), at most ``max_restarts`` times; ids
read twice count once. When the pages so far came in datestamp order the restarted listing still
proves itself complete; otherwise (the protocol promises no order) a record older than that
datestamp not yet read could be missed, so the listing is taken as cut (nothing removed on it;
the next reconciliation finds what was missed). A token that comes round again (a loop), more
than ``max_pages`` pages, or a page that does not move on cuts the listing with a warning: not
complete.

Deleted records: a header with ``status="deleted"`` (Identify's ``deletedRecord`` persistent or
transient; Zenodo sends one while saying ``no``, metadata included) becomes a deletion
(domain/dataset.py ``deletion``): the pipeline removes the dataset held under that identifier on
any run, under the removal guard (store/deletions.py); one never held is nothing.

Records: ``source_id`` is the OAI identifier (``oai:zenodo.org:2217771``), ``metadata_modified``
the header's datestamp (what ListIdentifiers lists, so reconciliation compares like with like). The
oai_dc mapping: dc:title, dc:description, dc:subject (tags), dc:publisher (organisation), dc:rights
(an access right such as ``info:eu-repo/semantics/openAccess``, a licence name and a licence URL:
the licence is the URL, else the name), dc:identifier (a DOI or other http(s) URL: the landing
page), dc:language (the record's language), every other element kept as an extra. The DataCite
mapping (kernel 3 and 4, bare or in ``oai_datacite``'s payload): identifier (DOI), titles with
``xml:lang`` (translations), creators, subjects, publisher, rightsList, descriptions,
relatedIdentifiers, language, the rest as extras.

Errors: the protocol sends ``<error code=...>`` with HTTP 200, Zenodo with 422: the body is read
before a 4xx is taken as a failure. ``badArgument``, ``cannotDisseminateFormat``, ``badVerb``,
``noSetHierarchy`` are terminal and named; 5xx and 429 are retried by the fetcher (Retry-After
honoured for 429). A body that is not XML is retried (a proxy's page, a cut answer); XML that is not
an OAI-PMH answer is terminal. A document with a DOCTYPE is refused unread (OAI-PMH answers are
XML Schema documents and never have one: entity bombs live there); the fetcher caps size and time.

Reconciliation: ``list_ids`` pages ``ListIdentifiers`` (headers only; deleted headers are not live
ids) and raises SourceError when its token chain was cut; ``fetch_by_ids`` asks ``GetRecord`` per
id (``idDoesNotExist`` or a deleted header: left out); ``count`` is None (no count, see above).
"""
from __future__ import annotations

import logging
from dataclasses import replace
import xml.etree.ElementTree as ET
from datetime import datetime, timezone
from typing import Iterator
from urllib.parse import urlencode

from harvester.config.portals import OAI_PMH
from harvester.domain.dataset import DatasetRecord, clean_text, deletion, failed, package_record, parse_timestamp, slug
from harvester.domain.outcomes import problem
from harvester.http import scrub_url
from harvester.sources.base import Capabilities, CountsTraffic, IdPage, Listing, SourceError, to_ms
from harvester.sources.csw import language_tag
from harvester.sources.xml_chars import Forbidden
from harvester.sources.xml_chars import identifier_problem as forbidden_identifier
from harvester.sources.xml_chars import warning as forbidden_warning

log = logging.getLogger(__name__)

OAI = "http://www.openarchives.org/OAI/2.0/"
NS = {
    "oai": OAI,
    "oai_dc": "http://www.openarchives.org/OAI/2.0/oai_dc/",
    "dc": "http://purl.org/dc/elements/1.1/",
    "xml": "http://www.w3.org/XML/1998/namespace",
    "xsi": "http://www.w3.org/2001/XMLSchema-instance",
}
XML_LANG = f"{{{NS['xml']}}}lang"
DATACITE_PREFIX = "http://datacite.org/schema/kernel-"
METADATA_PREFIXES = ("oai_dc", "datacite", "oai_datacite")
DAY, SECONDS = "YYYY-MM-DD", "YYYY-MM-DDThh:mm:ssZ"
# OAI error codes after which the request cannot succeed as it is (protocol section 3.6)
# Pages in a row without a record (each with a new token) after which a listing is taken as going nowhere.
MAX_EMPTY_PAGES = 20
TERMINAL = ("badArgument", "badVerb", "cannotDisseminateFormat", "noSetHierarchy", "noMetadataFormats")


class OaiError(SourceError):
    """An OAI-PMH ``<error>``: ``code`` (badResumptionToken, noRecordsMatch...) and its text."""

    def __init__(self, message: str, code: str, text: str):
        super().__init__(message)
        self.code, self.text = code, text


class _NoDoctype(ET.TreeBuilder):
    def doctype(self, name, pubid, system):  # called by the parser at <!DOCTYPE, before any entity
        raise SourceError(f"the answer declares a DOCTYPE ({name}): refused unread (an OAI-PMH answer has none; "
                          "entity declarations there can expand a small answer into gigabytes)")


def parse_xml(body: bytes) -> ET.Element:
    """An answer's XML, refused (SourceError) when it declares a DOCTYPE; ET.ParseError when it is
    not XML."""
    parser = ET.XMLParser(target=_NoDoctype())
    parser.feed(body)
    return parser.close()


def q(name: str) -> str:
    prefix, _, local = name.partition(":")
    return f"{{{NS[prefix]}}}{local}"


def _text(element: ET.Element | None) -> str:
    return "".join(element.itertext()).strip() if element is not None else ""


def _local(tag: str) -> str:
    return tag.rpartition("}")[2]


def _leaves(element: ET.Element, path: str, out: dict[str, list[str]]) -> None:
    """Every text and attribute value under ``element``, keyed by its path of local names."""
    here = f"{path}/{_local(element.tag)}" if path else _local(element.tag)
    for attr, value in sorted(element.attrib.items()):
        if value.strip() and not attr.startswith(f"{{{NS['xsi']}}}"):
            out.setdefault(f"{here}@{_local(attr)}", []).append(value.strip())
    children = list(element)
    if not children:
        if element.text and element.text.strip():
            out.setdefault(here, []).append(element.text.strip())
        return
    for child in children:
        _leaves(child, here, out)


def _extras(leaves: dict[str, list[str]]) -> list[dict]:
    return [{"key": k, "value": v[0] if len(v) == 1 else v} for k, v in sorted(leaves.items())]


def _is_url(value: str) -> bool:
    return value.lower().startswith(("http://", "https://"))


def _landing_page(identifiers: list[str]) -> str | None:
    """A DOI URL among the identifiers, else the first http(s) one."""
    urls = [i for i in identifiers if _is_url(i)]
    return next((u for u in urls if "doi.org/" in u.lower()), urls[0] if urls else None)


def _translations(elements: list[ET.Element]) -> dict[str, str]:
    out: dict[str, str] = {}
    for e in elements:
        lang, text = (e.get(XML_LANG) or "").strip().lower(), _text(e)
        if lang and text:
            out.setdefault(lang, text)
    return out


# -- the mappings -------------------------------------------------------------------------------
def dc_package(dc: ET.Element) -> dict:
    """A CKAN-shaped package of an ``oai_dc:dc`` element (without id and dates: the header's)."""
    def all_of(name: str) -> list[ET.Element]:
        return [e for e in dc.iterfind(name, NS) if _text(e)]

    def texts(name: str) -> list[str]:
        return [_text(e) for e in all_of(name)]

    titles, descriptions = all_of("dc:title"), all_of("dc:description")
    rights = texts("dc:rights")
    licence_urls = [r for r in rights if _is_url(r)]
    licence_names = [r for r in rights if not _is_url(r) and not r.startswith("info:eu-repo/")]
    access = [r for r in rights if r.startswith("info:eu-repo/")]
    publisher = (texts("dc:publisher") or [None])[0]
    leaves: dict[str, list[str]] = {}
    mapped = {q("dc:title"), q("dc:description"), q("dc:subject"), q("dc:rights")}
    for child in dc:
        if child.tag not in mapped:
            _leaves(child, "", leaves)
    if access:
        leaves["access_right"] = access
    languages = texts("dc:language")
    return {
        "title": _text(titles[0]) if titles else "",
        "notes": "\n\n".join(_text(e) for e in descriptions),
        "tags": [{"name": t} for t in sorted(set(texts("dc:subject")))],
        "organization": {"title": publisher, "name": slug(publisher)} if publisher else None,
        "license_id": (licence_urls or licence_names or [None])[0],
        "license_title": (licence_names or [None])[0],
        "url": _landing_page(texts("dc:identifier")),
        "language": languages[0] if languages else None,
        "extras": _extras(leaves),
        "translations": {"title": _translations(titles), "description": _translations(descriptions)},
        "schema": "oai_dc",
    }


def datacite_package(resource: ET.Element) -> dict:
    """A CKAN-shaped package of a DataCite ``resource`` (kernel 3 or 4)."""
    ns = resource.tag[1:].partition("}")[0]

    def find_all(path: str) -> list[ET.Element]:
        return [e for e in resource.iterfind("/".join(f"{{{ns}}}{p}" for p in path.split("/"))) if _text(e)]

    titles = find_all("titles/title")
    main = [t for t in titles if not t.get("titleType")] or titles
    descriptions = find_all("descriptions/description")
    abstracts = [d for d in descriptions if (d.get("descriptionType") or "") == "Abstract"] or descriptions
    rights = find_all("rightsList/rights") + [r for r in resource.iterfind(f"{{{ns}}}rightsList/{{{ns}}}rights")
                                              if not _text(r) and r.get("rightsURI")]
    licences = [r.get("rightsURI") or r.get("rightsIdentifier") or _text(r) for r in rights
                if not (r.get("rightsURI") or "").startswith("info:eu-repo/")]
    access = [r.get("rightsURI") for r in rights if (r.get("rightsURI") or "").startswith("info:eu-repo/")]
    identifier = resource.find(f"{{{ns}}}identifier")
    doi = _text(identifier) if identifier is not None and (identifier.get("identifierType") or "").upper() == "DOI" \
        else ""
    url = f"https://doi.org/{doi}" if doi else None
    if url is None and identifier is not None and _is_url(_text(identifier)):
        url = _text(identifier)
    publisher = _text(resource.find(f"{{{ns}}}publisher")) or None
    leaves: dict[str, list[str]] = {}
    mapped = {f"{{{ns}}}{n}" for n in ("titles", "descriptions", "subjects", "rightsList", "publisher")}
    for child in resource:
        if child.tag not in mapped:
            _leaves(child, "", leaves)
    if access:
        leaves["access_right"] = access
    return {
        "title": _text(main[0]) if main else "",
        "notes": "\n\n".join(_text(d) for d in abstracts),
        "tags": [{"name": t} for t in sorted({_text(s) for s in find_all("subjects/subject")})],
        "organization": {"title": publisher, "name": slug(publisher)} if publisher else None,
        "license_id": licences[0] if licences else None,
        "license_title": _text(rights[0]) if rights and _text(rights[0]) else None,
        "url": url,
        "language": _text(resource.find(f"{{{ns}}}language")) or None,
        "extras": _extras(leaves),
        "translations": {"title": _translations(titles), "description": _translations(descriptions)},
        "schema": "datacite",
    }


def _datacite_resource(metadata: ET.Element) -> ET.Element | None:
    return next((e for e in metadata.iter() if e.tag.startswith("{" + DATACITE_PREFIX) and _local(e.tag) == "resource"),
                None)


def header_of(header: ET.Element) -> tuple[str, datetime | None, str, bool, list[str]]:
    """(identifier, datestamp, the datestamp as written, deleted, setSpecs) of a ``header``."""
    stamp = _text(header.find("oai:datestamp", NS))
    return (_text(header.find("oai:identifier", NS)), parse_timestamp(stamp) if stamp else None, stamp,
            header.get("status") == "deleted", [_text(s) for s in header.iterfind("oai:setSpec", NS)])


def record_of(element: ET.Element, record_url, portal_language: str | None = None) -> DatasetRecord:
    """One ``record`` of a ListRecords / GetRecord answer: a dataset, a deletion, or a Failed record."""
    header = element.find("oai:header", NS)
    if header is None:
        return failed(None, {}, [problem("no-identifier", "an OAI-PMH record without a header", "header")])
    identifier, stamp, written, deleted, sets = header_of(header)
    if not identifier:
        return failed(None, {}, [problem("no-identifier", "an OAI-PMH record header without an identifier",
                                         "header/identifier")])
    if deleted:
        return deletion(identifier, stamp)
    if stamp is None:
        return failed(identifier, {"id": identifier}, [problem(
            "bad-date", f"OAI-PMH record {identifier!r}: datestamp {written[:100]!r} is not a date", "header/datestamp",
            written)])
    metadata = element.find("oai:metadata", NS)
    dc = metadata.find("oai_dc:dc", NS) if metadata is not None else None
    resource = _datacite_resource(metadata) if metadata is not None and dc is None else None
    if dc is not None:
        package = dc_package(dc)
    elif resource is not None:
        package = datacite_package(resource)
    else:
        found = _local(next(iter(metadata), metadata).tag) if metadata is not None else "no metadata"
        return failed(identifier, {"id": identifier}, [problem(
            "invalid-record", f"OAI-PMH record {identifier!r} holds neither oai_dc nor DataCite metadata ({found})",
            "metadata")])
    title = clean_text(package["title"])
    if not title:
        return failed(identifier, {"id": identifier}, [problem("no-title", f"OAI-PMH record {identifier!r} has no title",
                                                               "metadata/title")])
    language = package.pop("language")
    package.update({"id": identifier, "metadata_modified": stamp.isoformat(),
                    "url": package["url"] or record_url(identifier)})
    if sets:
        package["extras"].append({"key": "setSpec", "value": sets[0] if len(sets) == 1 else sets})
    tags = [t["name"] for t in package["tags"]]
    org = package["organization"]["title"] if package["organization"] else None
    return package_record(package, source_id=identifier, url=package["url"], title=title,
                          description=clean_text(package["notes"]), tags=tags, organization=org,
                          language=language_tag(language) if language else None)


class OaiPmhSource(CountsTraffic):
    """An OAI-PMH 2.0 repository at ``url`` (its base URL) through ``fetcher`` (an ``http.HttpFetcher``).
    ``portal``: the Portal (its name, oai_metadata_prefix, oai_set) or a name."""

    kind = OAI_PMH
    capabilities = Capabilities(incremental=True, reconcile=True)

    def __init__(self, url: str, *, fetcher, portal=None, metadata_prefix: str | None = None,
                 oai_set: str | None = None, max_pages: int = 100_000, max_restarts: int = 5):
        name = getattr(portal, "name", portal)
        self.metadata_prefix = metadata_prefix or getattr(portal, "oai_metadata_prefix", None) or "oai_dc"
        if self.metadata_prefix not in METADATA_PREFIXES:
            raise ValueError(f"{scrub_url(url)}: metadataPrefix {self.metadata_prefix!r} is not one of "
                             f"{', '.join(METADATA_PREFIXES)}")
        self.oai_set = oai_set or getattr(portal, "oai_set", None)
        self.url, self.fetcher, self.max_pages, self.max_restarts = url, fetcher, max_pages, max_restarts
        self.label = f"portal {name} ({scrub_url(url)})" if name else scrub_url(url)
        self.granularity: str | None = None
        self.total: int | None = None
        self.pages = self.restarts = 0
        self.complete = self.cut = False
        self.forbidden = Forbidden()  # characters XML 1.0 forbids met in the answers (sources/xml_chars.py)

    def __repr__(self) -> str:
        return f"OaiPmhSource({scrub_url(self.url)!r}, metadataPrefix={self.metadata_prefix!r})"

    # -- requests
    def record_url(self, identifier: str) -> str:
        params = {"verb": "GetRecord", "metadataPrefix": self.metadata_prefix, "identifier": identifier}
        return f"{self.url}{'&' if '?' in self.url else '?'}{urlencode(params)}"

    def _get(self, params: dict, what: str) -> ET.Element:
        """The ``OAI-PMH`` root of an answer; OaiError for an ``<error>`` in it (HTTP 200 or 4xx)."""
        shown = f"{self.label} ({what})"

        def parse(resp):
            try:
                # a character XML 1.0 forbids (&#x1;, a raw 0x1A, &#xD800;) would fail the whole page: it
                # is read with each one marked, the records holding one warned (sources/xml_chars.py)
                root = self.forbidden.answer(resp, parse_xml, shown)
            except SourceError as exc:
                raise SourceError(f"{shown}: {exc}") from None
            if root.tag != f"{{{OAI}}}OAI-PMH":
                raise SourceError(f"{shown}: not an OAI-PMH answer (HTTP {resp.status_code}, root element "
                                  f"{_local(root.tag)[:100]!r}); is {scrub_url(self.url)} the repository's base URL?")
            error = root.find("oai:error", NS)
            if error is not None:
                code, text = error.get("code") or "", _text(error)
                raise OaiError(f"{shown}: the repository answered the OAI-PMH error {code or '(no code)'}"
                               f"{': ' + text[:300] if text else ''} (HTTP {resp.status_code})", code, text)
            if resp.status_code >= 300:
                raise SourceError(f"{shown}: GET {scrub_url(resp.url)}: HTTP {resp.status_code}")
            return root

        return self.fetcher.get(self.url, params=params, headers={"Accept": "text/xml, application/xml"},
                                parse=parse, what=f"{shown}: GET {scrub_url(self.url)}")

    def identify(self) -> str:
        """The repository's datestamp granularity (Identify, asked once)."""
        if self.granularity is None:
            root = self._get({"verb": "Identify"}, "Identify")
            value = _text(root.find("oai:Identify/oai:granularity", NS))
            self.granularity = SECONDS if value == SECONDS else DAY
            if value not in (DAY, SECONDS):
                log.warning("%s: Identify gives the granularity %r, not one of the protocol's; datestamps are sent "
                            "as days", self.label, value[:100])
        return self.granularity

    def stamp(self, when: datetime) -> str:
        """``when`` as a ``from`` argument in the repository's granularity (rounded down: inclusive)."""
        when = when.replace(tzinfo=timezone.utc) if when.tzinfo is None else when.astimezone(timezone.utc)
        return when.strftime("%Y-%m-%dT%H:%M:%SZ" if self.identify() == SECONDS else "%Y-%m-%d")

    def _first_params(self, verb: str, since: datetime | None) -> dict:
        params = {"verb": verb, "metadataPrefix": self.metadata_prefix}
        if self.oai_set:
            params["set"] = self.oai_set
        if since is not None:
            params["from"] = self.stamp(since)
        return params

    # -- listing
    def _pages(self, verb: str, since: datetime | None) -> Iterator[list[ET.Element]]:
        """The ``record`` (ListRecords) or ``header`` (ListIdentifiers) elements of each page,
        following resumption tokens; sets ``complete`` on the protocol's proof, ``cut`` otherwise."""
        self.pages = self.restarts = 0
        self.complete = self.cut = False
        self.total = None
        item = "oai:record" if verb == "ListRecords" else "oai:header"
        params = self._first_params(verb, since)
        tokens: set[str] = set()
        last_stamp: datetime | None = None
        ordered, empty, stalled = True, 0, 0
        restarts_from: list[datetime | None] = []

        def params_from(when: datetime | None) -> str:
            return self.stamp(when) if when is not None else "the beginning"

        while True:
            if self.pages >= self.max_pages:
                log.warning("%s: more than %d pages; listing stopped there", self.label, self.max_pages)
                self.cut = True
                return
            what = f"{verb} page {self.pages + 1}" + (" (restarted)" if self.restarts else "")
            try:
                root = self._get(params, what)
            except OaiError as exc:
                if exc.code == "noRecordsMatch":
                    self.complete = not self.cut
                    return
                if exc.code == "badResumptionToken" and "resumptionToken" in params:
                    self.restarts += 1
                    restart = last_stamp or since
                    # restarts that got no further than the last one (every record of a page on one
                    # datestamp, a token refused every time) are bounded; those that moved on are not
                    stalled = stalled + 1 if restarts_from and restart == restarts_from[-1] else 1
                    restarts_from.append(restart)
                    if stalled > self.max_restarts:
                        raise SourceError(f"{self.label}: {verb}: the resumption token expired {stalled} times in a row "
                                          f"without the listing getting past {params_from(restart)} (at most "
                                          f"{self.max_restarts} restarts); last: {exc}") from None
                    params = self._first_params(verb, restart)
                    if not ordered:
                        self.cut = True
                    log.warning("%s: %s: the resumption token was refused (badResumptionToken: expired or unknown); "
                                "listing again from %s (restart %d of at most %d)%s", self.label, verb,
                                params.get("from", "the beginning"), self.restarts, self.max_restarts,
                                "" if ordered else "; the pages did not come in datestamp order, so records older "
                                "than that not read yet may be missed: the listing counts as cut")
                    continue
                raise
            self.pages += 1
            container = root.find(f"oai:{verb}", NS)
            if container is None:
                raise SourceError(f"{self.label}: the {verb} answer has no {verb} element")
            elements = container.findall(item, NS)
            for element in elements:
                header = element if verb == "ListIdentifiers" else element.find("oai:header", NS)
                stamp = parse_timestamp(_text(header.find("oai:datestamp", NS))) if header is not None else None
                if stamp is not None:
                    if last_stamp is not None and stamp < last_stamp:
                        ordered = False
                    last_stamp = stamp
            token_element = container.find("oai:resumptionToken", NS)
            token = _text(token_element)
            if token_element is not None:
                size = token_element.get("completeListSize")
                if size is not None and size.strip().isdigit():
                    self.total = int(size.strip())
            yield elements
            if not token:
                self.complete = not self.cut
                return
            if token in tokens:
                log.warning("%s: %s: the resumption token %r came round again; listing cut there", self.label, verb,
                            token[:80])
                self.cut = True
                return
            empty = 0 if elements else empty + 1
            if empty > MAX_EMPTY_PAGES:
                log.warning("%s: %s: %d pages in a row without a record, each with a new token; listing cut there",
                            self.label, verb, empty)
                self.cut = True
                return
            tokens.add(token)
            params = {"verb": verb, "resumptionToken": token}

    def iter_records(self, since: datetime | None = None, page_size: int | None = None,
                     listing: Listing | None = None, validators: dict | None = None) -> Iterator[list[DatasetRecord]]:
        """``base.Source``: records (and deletions) with a datestamp from ``since`` on (all when None).
        ``page_size`` is the repository's to choose: not sent."""
        seen: set[str] = set()
        for elements in self._pages("ListRecords", since):
            page = []
            for element in elements:
                record = self._record(element)
                if record.source_id is not None and not record.error:
                    if (record.source_id, record.deleted) in seen:
                        continue  # (read again after a restart)
                    seen.add((record.source_id, record.deleted))
                page.append(record)
            if page:
                yield page
        if listing is not None:
            listing.complete = self.complete and since is None

    def _record(self, element: ET.Element) -> DatasetRecord:
        """``record_of``, for a page read with characters XML 1.0 forbids marked: an identifier holding
        one fails its record (never altered), another text holding one is read with U+FFFD and warned."""
        if not self.forbidden.met:
            return record_of(element, self.record_url)
        header = element.find("oai:header", NS)
        identifier = _text(header.find("oai:identifier", NS)) if header is not None else ""
        if self.forbidden.marked(identifier):
            shown = self.forbidden.escaped(identifier)
            _, found = self.forbidden.restore(identifier)
            return failed(shown, {"id": shown}, [forbidden_identifier(shown, found, "header/identifier")])
        found = self.forbidden.restore_element(element)
        record = record_of(element, self.record_url)
        if found and record.ok and not record.deleted:
            record = replace(record, problems=record.problems + (forbidden_warning(record.source_id, found),))
        return record

    # -- reconciliation (sources/base.py) ------------------------------------------------------------
    def count(self) -> int | None:
        """None: completeListSize is optional and, on some servers, an estimate (see the docstring)."""
        return None

    def list_ids(self, page_size: int) -> Iterator[IdPage]:
        """Every live identifier with its datestamp, from ListIdentifiers (deleted headers left out)."""
        seen: set[str] = set()
        for headers in self._pages("ListIdentifiers", None):
            ids, unusable = [], 0
            for header in headers:
                identifier, stamp, _, deleted, _ = header_of(header)
                identifier = self.forbidden.escaped(identifier)  # (as its failed record has it)
                if deleted:
                    continue
                if not identifier:
                    unusable += 1
                    continue
                if identifier in seen:
                    continue
                seen.add(identifier)
                ids.append((identifier, to_ms(stamp) if stamp else None))
            yield IdPage(ids, unusable)
        if not self.complete:
            raise SourceError(f"{self.label}: the identifier listing was cut short ({self.pages} pages read, see the "
                              "warning above); an incomplete listing cannot be reconciled with")

    def fetch_by_ids(self, ids: list[str], per_request: int = 100) -> Iterator[list[DatasetRecord]]:
        """The records of ``ids``, one GetRecord each; ids the repository no longer has
        (idDoesNotExist) or has deleted are left out."""
        page: list[DatasetRecord] = []
        for identifier in ids:
            params = {"verb": "GetRecord", "metadataPrefix": self.metadata_prefix, "identifier": identifier}
            try:
                root = self._get(params, f"GetRecord {identifier}")
            except OaiError as exc:
                if exc.code == "idDoesNotExist":
                    continue
                raise
            element = root.find("oai:GetRecord/oai:record", NS)
            if element is None:
                continue
            record = self._record(element)
            if not record.deleted and record.source_id == identifier:
                page.append(record)
            if len(page) >= max(1, per_request):
                yield page
                page = []
        if page:
            yield page
