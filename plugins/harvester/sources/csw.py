"""OGC CSW 2.0.2 catalogues (``type: csw``): GeoNetwork, pycsw, deegree, ESRI Geoportal...

The catalogue is listed with KVP ``GetRecords`` GETs (``resultType=results``,
``elementSetName=full``), in ISO 19139 (``outputSchema=http://www.isotc211.org/2005/gmd``, the
default) or Dublin Core (``csw:Record``), ``startPosition``/``maxRecords`` paged by the answer's
``nextRecord`` (0, or past ``numberOfRecordsMatched``: the end). A ``nextRecord`` that does not
advance or comes round again ends the listing with a warning, incomplete (nothing is removed).
``total`` is ``numberOfRecordsMatched``.

Each record becomes a CKAN-shaped package (as in dcat_rdf.py), so hashes and search keys work on it:

- ISO 19139 (``gmd:MD_Metadata`` / ``gmi:MI_Metadata``): ``fileIdentifier`` is the source id;
  ``title`` / ``abstract`` / ``descriptiveKeywords`` of the identification; the organisation of
  its ``pointOfContact`` (else of the metadata ``contact``); the licence from ``otherConstraints``
  (else ``useLimitation``); ``dateStamp`` as ``metadata_modified``; each distribution
  ``CI_OnlineResource`` (linkage, protocol, name) a resource. ``gmd:PT_FreeText`` translations are
  kept in ``translations`` (title, description, keywords, by language) as dcat_rdf keeps DCAT's.
  Every other value of the record (leaf texts, code list values, xlink:hrefs) goes to ``extras``,
  keyed by its element path, so the metadata hash sees an edit anywhere.
- Dublin Core (``csw:Record``): ``dc:identifier``, ``dc:title``, ``dct:abstract`` (else
  ``dc:description``), ``dc:subject``, ``dct:modified`` (else ``dc:date``), ``dc:publisher`` (else
  ``dc:creator``), ``dc:rights`` / ``dct:license``, ``dct:references`` and ``dc:URI`` as resources.

Incremental listings add an OGC Filter ``PropertyIsGreaterThanOrEqualTo`` on ``apiso:Modified``
(ISO) / ``dct:modified`` (DC). An ``ows:ExceptionReport`` answering it, or records older than
``since`` (by more than a day: date-only stamps, time zones) coming back, raise ``FilterRejected``
(the pipeline falls back to a full listing). Any other ExceptionReport is a ``SourceError`` naming
the portal and the exceptionCode.

Reconciliation (``reconcile``): ``count`` is one ``resultType=hits`` GetRecords; ``list_ids`` pages
``elementSetName=summary`` records (id and dateStamp / dct:modified; ``brief`` has no date);
``fetch_by_ids`` asks GetRecordById with comma-separated ids (a ``NotFound`` report: none held).

Every request goes through ``http.HttpFetcher`` (GET with KVP parameters: it cannot POST); a 2xx
body that is not XML (a proxy's page, a truncated answer) is retried. XML is read with the
standard library's expat parser, which resolves no external entities; an answer declaring a
DOCTYPE is refused unread (CSW answers are XML Schema documents and never have one: entity bombs
live there), except an HTML page's ``<!DOCTYPE html>``, which is a proxy's page like any other
(retried); the fetcher caps size and time.

A character XML 1.0 forbids (``&#x1;``, ``&#0;``, ``&#xD800;``, a raw 0x1A) would fail the parse of
its whole page, on every run: a page that does not parse is read again with each such character
marked (sources/xml_chars.py, as for OAI-PMH); a record holding one is read with U+FFFD and warned
(``invalid-xml-character``), one whose identifier holds one fails alone (``unstorable-identifier``,
its identifier shown escaped), the page's other records are read as usual.
"""
from __future__ import annotations

import logging
import xml.etree.ElementTree as ET
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone
from typing import Iterator
from urllib.parse import urlencode

from harvester.config.portals import CSW
from harvester.domain.dataset import DatasetRecord, clean_text, failed, package_record, slug
from harvester.domain.outcomes import problem
from harvester.http import Retryable, scrub_url
from harvester.domain.dataset import parse_timestamp
from harvester.sources.base import Capabilities, CountsTraffic, FilterRejected, IdPage, Listing, SourceError, to_ms
from harvester.sources.xml_chars import Forbidden
from harvester.sources.xml_chars import identifier_problem as forbidden_identifier
from harvester.sources.xml_chars import warning as forbidden_warning

log = logging.getLogger(__name__)

NS = {
    "csw": "http://www.opengis.net/cat/csw/2.0.2",
    "gmd": "http://www.isotc211.org/2005/gmd",
    "gmi": "http://www.isotc211.org/2005/gmi",
    "gco": "http://www.isotc211.org/2005/gco",
    "gmx": "http://www.isotc211.org/2005/gmx",
    "srv": "http://www.isotc211.org/2005/srv",
    "gml": "http://www.opengis.net/gml",
    "gml32": "http://www.opengis.net/gml/3.2",
    "xlink": "http://www.w3.org/1999/xlink",
    "xsi": "http://www.w3.org/2001/XMLSchema-instance",
    "dc": "http://purl.org/dc/elements/1.1/",
    "dct": "http://purl.org/dc/terms/",
    "ows": "http://www.opengis.net/ows",
    "ogc": "http://www.opengis.net/ogc",
    "apiso": "http://www.opengis.net/cat/csw/apiso/1.0",
    "geonet": "http://www.fao.org/geonetwork",
}
_PREFIX = {uri: prefix for prefix, uri in NS.items()}
ISO_SCHEMA = NS["gmd"]
DC_SCHEMA = NS["csw"]
SCHEMAS = {"iso": ISO_SCHEMA, "dc": DC_SCHEMA}
# ISO 639-2 (bibliographic and terminology) codes of the usual catalogue languages, as the
# two-letter tags translations are keyed by elsewhere (DCAT's xml:lang).
_LANG2 = {"eng": "en", "fre": "fr", "fra": "fr", "dut": "nl", "nld": "nl", "ger": "de", "deu": "de", "ita": "it",
          "spa": "es", "por": "pt", "pol": "pl", "cze": "cs", "ces": "cs", "dan": "da", "fin": "fi", "swe": "sv",
          "nor": "no", "gre": "el", "ell": "el", "hun": "hu", "rum": "ro", "ron": "ro", "slo": "sk", "slk": "sk",
          "slv": "sl", "est": "et", "lav": "lv", "lit": "lt", "bul": "bg", "hrv": "hr", "gle": "ga", "mlt": "mt",
          "ice": "is", "isl": "is", "ltz": "lb", "roh": "rm"}
_ISO_ROOTS = (f"{{{NS['gmd']}}}MD_Metadata", f"{{{NS['gmi']}}}MI_Metadata")
_DC_ROOT = f"{{{NS['csw']}}}Record"
_DC_ROOTS = (_DC_ROOT, f"{{{NS['csw']}}}SummaryRecord", f"{{{NS['csw']}}}BriefRecord")
# A filtered record older than since by more than this is taken as the filter ignored.
_FILTER_SLACK = timedelta(days=1)


class CswError(SourceError):
    """An ``ows:ExceptionReport``: ``code`` its exceptionCode, ``text`` its ExceptionText."""

    def __init__(self, message: str, code: str, text: str):
        super().__init__(message)
        self.code, self.text = code, text


class Doctype(Exception):
    """An answer declaring a DOCTYPE (``name`` its root name), met before anything in it is read."""

    def __init__(self, name: str | None):
        super().__init__(name)
        self.name = name or ""


class _NoDoctype(ET.TreeBuilder):
    def doctype(self, name, pubid, system):  # called by the parser at <!DOCTYPE, before any entity
        raise Doctype(name)


def parse_xml(body: bytes) -> ET.Element:
    """An answer's XML; ``Doctype`` when it declares one (refused unread), ET.ParseError when it
    is not XML."""
    parser = ET.XMLParser(target=_NoDoctype())
    parser.feed(body)
    return parser.close()


def q(name: str) -> str:
    """``gmd:title`` as ElementTree's ``{uri}title``."""
    prefix, _, local = name.partition(":")
    return f"{{{NS[prefix]}}}{local}"


def short(tag: str) -> str:
    """``{uri}title`` as ``gmd:title`` (an unknown namespace keeps its URI)."""
    if tag.startswith("{"):
        uri, _, local = tag[1:].partition("}")
        return f"{_PREFIX[uri]}:{local}" if uri in _PREFIX else tag
    return tag


def language_tag(code: str | None) -> str:
    code = (code or "").strip().lstrip("#").lower()
    return _LANG2.get(code, code)


# -- ISO 19139 ----------------------------------------------------------------------------------
def _locales(md: ET.Element) -> tuple[str, dict[str, str]]:
    """(the record's own language tag, {PT_Locale id: language tag})."""
    own = md.find("gmd:language/gmd:LanguageCode", NS)
    own_code = (own.get("codeListValue") or own.text) if own is not None else None
    if own_code is None:
        own_code = md.findtext("gmd:language/gco:CharacterString", None, NS)
    locales = {}
    for loc in md.iterfind("gmd:locale/gmd:PT_Locale", NS):
        code = loc.find("gmd:languageCode/gmd:LanguageCode", NS)
        value = (code.get("codeListValue") or code.text) if code is not None else None
        locales[loc.get("id") or ""] = language_tag(value or loc.get("id"))
    return language_tag(own_code), locales


def free_text(prop: ET.Element | None, own: str, locales: dict[str, str]) -> tuple[str, dict[str, str]]:
    """A CharacterString property (``gco:CharacterString`` or ``gmx:Anchor``, with or without
    ``gmd:PT_FreeText``) as (its text, {language: text}); the record's own language holds the
    plain text, each ``LocalisedCharacterString`` its locale's language."""
    if prop is None:
        return "", {}
    text = ""
    for child in prop:
        if child.tag in (q("gco:CharacterString"), q("gmx:Anchor")):
            text = (child.text or "").strip()
            break
    translations: dict[str, str] = {}
    if text and own:
        translations[own] = text
    for lcs in prop.iterfind("gmd:PT_FreeText/gmd:textGroup/gmd:LocalisedCharacterString", NS):
        value = (lcs.text or "").strip()
        locale = (lcs.get("locale") or "").lstrip("#")
        if value:
            translations.setdefault(locales.get(locale, language_tag(locale)) or "und", value)
    if not text and translations:
        text = translations.get(own) or translations.get("en") or translations[sorted(translations)[0]]
    return text, translations


def _pick(text: str, translations: dict[str, str], language: str | None) -> str:
    return translations.get(language, text) if language else text


_LEAF_ATTRS = ("codeListValue", q("xlink:href"), q("xlink:title"), "locale", "uom")


def _leaves(element: ET.Element, path: str, out: dict[str, list[str]], skip: set[int]) -> None:
    """Every value under ``element``: leaf texts, code list values and xlink:hrefs, by path."""
    if id(element) in skip:
        return
    here = f"{path}/{short(element.tag)}" if path else short(element.tag)
    for attr in _LEAF_ATTRS:
        value = element.get(attr)
        if value and value.strip():
            out.setdefault(f"{here}@{short(attr)}", []).append(value.strip())
    children = list(element)
    if not children:
        if element.text and element.text.strip():
            out.setdefault(here, []).append(element.text.strip())
        return
    for child in children:
        _leaves(child, here, out, skip)


def _org_name(parties: list[ET.Element], own: str, locales: dict[str, str], language: str | None) -> str | None:
    for party in parties:
        text, translations = free_text(party.find("gmd:organisationName", NS), own, locales)
        text = _pick(text, translations, language)
        if text:
            return text
    return None


@dataclass
class IsoMapped:
    """What the ISO mapping reads from one record, before an identity is chosen for it: its
    ``file_id`` (``gmd:fileIdentifier``; "" when none), ``title`` and ``description`` (cleaned;
    ``title`` "" when none), ``tags``, ``organization``, the record's own language (``language``,
    from ``gmd:language``, as a two-letter tag where known) and the CKAN-shaped ``package`` (its
    ``id`` the file_id and ``url`` None until the caller sets them)."""

    file_id: str
    title: str
    description: str
    tags: list[str]
    organization: str | None
    language: str
    package: dict


def iso_record(md: ET.Element, record_url, language: str | None = None) -> DatasetRecord:
    """One ``gmd:MD_Metadata`` as a record (failed, with the reason, without an identifier or title).
    ``record_url(id)``: the record's URL (its GetRecordById)."""
    mapped = iso_mapping(md, language)
    file_id, title = mapped.file_id, mapped.title
    if not file_id:
        return failed(None, {"title": title or None}, [problem(
            "no-identifier", f"ISO record {title or '(untitled)'!r} has no gmd:fileIdentifier", "gmd:fileIdentifier")])
    if not title:
        return failed(file_id, {"id": file_id}, [problem(
            "no-title", f"ISO record {file_id!r} has no title (gmd:identificationInfo/*/gmd:citation/*/gmd:title)",
            "gmd:identificationInfo/*/gmd:citation/*/gmd:title")])
    package = mapped.package
    package["url"] = record_url(file_id)
    return package_record(package, source_id=file_id, url=package["url"], title=title,
                          description=mapped.description, tags=mapped.tags, organization=mapped.organization)


def iso_mapping(md: ET.Element, language: str | None = None) -> IsoMapped:
    """The ISO 19139 mapping of one ``gmd:MD_Metadata`` / ``gmi:MI_Metadata`` (module docstring),
    whatever identifies the record: a CSW's records by ``fileIdentifier`` (``iso_record``), a
    WAF's by their file's URL (sources/iso_waf.py). Never fails: a record without identifier or
    title has them empty."""
    own, locales = _locales(md)
    ident = md.find("gmd:identificationInfo/*", NS)
    file_id = free_text(md.find("gmd:fileIdentifier", NS), own, locales)[0]
    citation = ident.find("gmd:citation/gmd:CI_Citation", NS) if ident is not None else None
    title_prop = citation.find("gmd:title", NS) if citation is not None else None
    title_text, titles = free_text(title_prop, own, locales)
    title = clean_text(_pick(title_text, titles, language))
    abstract_prop = ident.find("gmd:abstract", NS) if ident is not None else None
    abstract_text, abstracts = free_text(abstract_prop, own, locales)
    mapped = {id(e) for e in (md.find("gmd:fileIdentifier", NS), md.find("gmd:dateStamp", NS), title_prop,
                              abstract_prop) if e is not None}

    tags: dict[str, None] = {}
    keywords_by_language: dict[str, set[str]] = {}
    for kw in (ident.iterfind("gmd:descriptiveKeywords/gmd:MD_Keywords/gmd:keyword", NS) if ident is not None else ()):
        text, translations = free_text(kw, own, locales)
        text = _pick(text, translations, language).strip()
        if text:
            tags[text] = None
        for lang, value in translations.items():
            keywords_by_language.setdefault(lang, set()).add(value)
        mapped.add(id(kw))

    parties = (ident.findall("gmd:pointOfContact/gmd:CI_ResponsibleParty", NS) if ident is not None else []) + \
        md.findall("gmd:contact/gmd:CI_ResponsibleParty", NS)
    org = _org_name(parties, own, locales, language)

    licences = []
    for path in ("gmd:resourceConstraints/*/gmd:otherConstraints", "gmd:resourceConstraints/*/gmd:useLimitation"):
        for prop in (ident.iterfind(path, NS) if ident is not None else ()):
            anchor = prop.find("gmx:Anchor", NS)
            text = _pick(*free_text(prop, own, locales), language) or (
                anchor.get(q("xlink:href"), "") if anchor is not None else "")
            if text.strip():
                licences.append(text.strip())

    resources = []
    for online in md.iterfind("gmd:distributionInfo/gmd:MD_Distribution/gmd:transferOptions/"
                              "gmd:MD_DigitalTransferOptions/gmd:onLine/gmd:CI_OnlineResource", NS):
        resources.append({
            "url": (online.findtext("gmd:linkage/gmd:URL", "", NS) or "").strip(),
            "format": free_text(online.find("gmd:protocol", NS), own, locales)[0],
            "name": _pick(*free_text(online.find("gmd:name", NS), own, locales), language),
            "description": _pick(*free_text(online.find("gmd:description", NS), own, locales), language),
        })
        mapped.add(id(online))

    stamp = md.find("gmd:dateStamp", NS)
    modified = None
    if stamp is not None:
        modified = (stamp.findtext("gco:DateTime", None, NS) or stamp.findtext("gco:Date", None, NS) or "").strip() or None

    leaves: dict[str, list[str]] = {}
    _leaves(md, "", leaves, mapped)
    extras = [{"key": k, "value": v[0] if len(v) == 1 else v} for k, v in sorted(leaves.items())]
    translations = {"title": titles, "description": abstracts,
                    "keywords": {lang: sorted(ks) for lang, ks in sorted(keywords_by_language.items())}}
    package = {
        "id": file_id,
        "title": title,
        "notes": _pick(abstract_text, abstracts, language),
        "url": None,
        "metadata_modified": modified,
        "license_id": licences[0] if licences else None,
        "organization": {"title": org, "name": slug(org)} if org else None,
        "tags": [{"name": t} for t in sorted(tags)],
        "resources": resources,
        "extras": extras,
        "translations": translations,
        "schema": "iso19139",
    }
    return IsoMapped(file_id=file_id, title=title, description=clean_text(package["notes"]), tags=sorted(tags),
                     organization=org, language=own, package=package)


# -- Dublin Core --------------------------------------------------------------------------------
_DC_MAPPED = {q(n) for n in ("dc:identifier", "dc:title", "dct:abstract", "dc:description", "dc:subject",
                             "dct:modified", "dct:references", "dc:URI")}


def dc_record(rec: ET.Element, record_url) -> DatasetRecord:
    """One ``csw:Record`` as a record (failed without dc:identifier or dc:title)."""
    def texts(name: str) -> list[str]:
        return [(e.text or "").strip() for e in rec.iterfind(name, NS) if (e.text or "").strip()]

    ids, titles = texts("dc:identifier"), texts("dc:title")
    title = clean_text(titles[0]) if titles else ""
    if not ids:
        return failed(None, {"title": title or None}, [problem(
            "no-identifier", f"Dublin Core record {title or '(untitled)'!r} has no dc:identifier", "dc:identifier")])
    if not title:
        return failed(ids[0], {"id": ids[0]}, [problem("no-title", f"Dublin Core record {ids[0]!r} has no dc:title",
                                                       "dc:title")])
    notes = (texts("dct:abstract") or texts("dc:description") or [""])[0]
    description_tag = q("dct:abstract") if texts("dct:abstract") else q("dc:description")
    tags = sorted(set(texts("dc:subject")))
    org = (texts("dc:publisher") or texts("dc:creator") or [None])[0]
    licences = texts("dct:license") + texts("dc:rights")
    modified = (texts("dct:modified") or texts("dc:date") or [None])[0]
    resources = [{"url": (e.text or "").strip(), "format": e.get("scheme") or "", "name": ""}
                 for e in rec.iterfind("dct:references", NS) if (e.text or "").strip()]
    resources += [{"url": (e.text or "").strip(), "format": e.get("protocol") or "", "name": e.get("name") or "",
                   "description": e.get("description") or ""}
                  for e in rec.iterfind("dc:URI", NS) if (e.text or "").strip()]
    leaves: dict[str, list[str]] = {}
    for child in rec:
        mapped = child.tag in _DC_MAPPED and not (child.tag == q("dc:description") and description_tag != child.tag)
        if mapped and child.tag == q("dc:identifier") and (child.text or "").strip() != ids[0]:
            mapped = False  # a second identifier is kept
        if not mapped:
            _leaves(child, "", leaves, set())
        for attr, value in sorted(child.attrib.items()):
            if not mapped and attr in _LEAF_ATTRS:
                continue  # _leaves kept it
            if value.strip() and not attr.startswith(f"{{{NS['xsi']}}}"):
                leaves.setdefault(f"{short(child.tag)}@{short(attr)}", []).append(value.strip())
    extras = [{"key": k, "value": v[0] if len(v) == 1 else v} for k, v in sorted(leaves.items())]
    package = {
        "id": ids[0], "title": titles[0], "notes": notes, "url": record_url(ids[0]), "metadata_modified": modified,
        "license_id": licences[0] if licences else None,
        "organization": {"title": org, "name": slug(org)} if org else None,
        "tags": [{"name": t} for t in tags], "resources": resources, "extras": extras, "schema": "csw:Record",
    }
    return package_record(package, source_id=ids[0], url=package["url"], title=title,
                          description=clean_text(notes), tags=tags, organization=org)


# -- answers ------------------------------------------------------------------------------------
def exception_of(root: ET.Element) -> tuple[str, str] | None:
    """(exceptionCode, text) of an ``ows:ExceptionReport`` (OWS 1.0 or 1.1/2.0), else None."""
    if not root.tag.endswith("}ExceptionReport") and root.tag != "ExceptionReport":
        return None
    exc = next((e for e in root.iter() if e.tag.endswith("}Exception") or e.tag == "Exception"), None)
    if exc is None:
        return "", ""
    code = exc.get("exceptionCode") or ""
    text = " ".join((t.text or "").strip() for t in exc.iter() if t.tag.endswith("ExceptionText") and t.text)
    locator = exc.get("locator")
    return code, (f"{text} (locator {locator})" if locator else text)


def records_of(root: ET.Element) -> list[ET.Element]:
    """The ISO and Dublin Core records of a GetRecords / GetRecordById answer."""
    container = root.find("csw:SearchResults", NS)
    container = root if container is None else container
    return [child for child in container if child.tag in _ISO_ROOTS or child.tag in _DC_ROOTS]


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


class CswSource(CountsTraffic):
    """A CSW 2.0.2 catalogue at ``url`` (its endpoint, e.g. ``.../geonetwork/srv/eng/csw``) through
    ``fetcher`` (an ``http.HttpFetcher``). ``schema``: ``iso`` (ISO 19139) or ``dc`` (csw:Record)."""

    kind = CSW
    capabilities = Capabilities(incremental=True, reconcile=True)

    def __init__(self, url: str, *, fetcher, schema: str = "iso", language: str | None = None,
                 max_pages: int = 100_000, portal: str | None = None):
        if schema not in SCHEMAS:
            raise ValueError(f"{scrub_url(url)}: schema {schema!r} is not one of {', '.join(SCHEMAS)}")
        self.url, self.fetcher, self.schema, self.language, self.max_pages = url, fetcher, schema, language, max_pages
        # how messages name the catalogue: "portal <name> (<url>)", or its URL alone
        self.label = f"portal {portal} ({scrub_url(url)})" if portal else scrub_url(url)
        self.total: int | None = None
        self.pages = 0
        self.listed = 0
        self.loop_cut = False
        self.complete = False
        self.forbidden = Forbidden()  # characters XML 1.0 forbids met in the answers (sources/xml_chars.py)

    def __repr__(self) -> str:
        return f"CswSource({scrub_url(self.url)!r}, schema={self.schema!r})"


    # -- requests
    def _namespaces(self) -> str:
        return ",".join(f"xmlns({p}={NS[p]})" for p in ("csw", "gmd", "apiso", "dc", "dct", "ogc"))

    def record_url(self, record_id: str) -> str:
        params = {"service": "CSW", "version": "2.0.2", "request": "GetRecordById", "id": record_id,
                  "elementSetName": "full", "outputSchema": SCHEMAS[self.schema]}
        return f"{self.url}{'&' if '?' in self.url else '?'}{urlencode(params)}"

    def getrecords_params(self, start: int, max_records: int, since: datetime | None,
                          element_set: str = "full", result_type: str = "results") -> dict:
        params = {"service": "CSW", "version": "2.0.2", "request": "GetRecords", "resultType": result_type,
                  "elementSetName": element_set, "outputSchema": SCHEMAS[self.schema],
                  "typeNames": "gmd:MD_Metadata" if self.schema == "iso" else "csw:Record",
                  "namespace": self._namespaces(), "startPosition": str(start), "maxRecords": str(max_records)}
        if since is not None:
            params.update({"constraintLanguage": "FILTER", "constraint_language_version": "1.1.0",
                           "constraint": self.modified_filter(since)})
        return params

    def modified_filter(self, since: datetime) -> str:
        since = since.replace(tzinfo=timezone.utc) if since.tzinfo is None else since.astimezone(timezone.utc)
        prop = "apiso:Modified" if self.schema == "iso" else "dct:modified"
        return (f'<ogc:Filter xmlns:ogc="{NS["ogc"]}" xmlns:apiso="{NS["apiso"]}" xmlns:dct="{NS["dct"]}">'
                f"<ogc:PropertyIsGreaterThanOrEqualTo><ogc:PropertyName>{prop}</ogc:PropertyName>"
                f"<ogc:Literal>{since.strftime('%Y-%m-%dT%H:%M:%SZ')}</ogc:Literal>"
                f"</ogc:PropertyIsGreaterThanOrEqualTo></ogc:Filter>")

    def _get(self, params: dict, what: str, filtered: bool = False) -> ET.Element:
        url = self.url
        shown = f"{self.label} ({what})"

        def parse(resp):
            try:
                # a character XML 1.0 forbids (&#x1;, a raw 0x1A, &#xD800;) would fail the whole page: it
                # is read with each one marked, the records holding one warned (sources/xml_chars.py)
                root = self.forbidden.answer(resp, parse_xml, shown)
            except Doctype as exc:
                if resp.status_code >= 400:
                    raise SourceError(f"{shown}: GET {scrub_url(resp.url)}: HTTP {resp.status_code}") from None
                if exc.name.lower() == "html":  # a proxy's or a login page, as any other page not XML
                    raise Retryable(f"{shown}: the answer is not XML (an HTML page)") from None
                raise SourceError(f"{shown}: GET {scrub_url(resp.url)}: the answer declares a DOCTYPE "
                                  f"({exc.name[:100]}): refused unread (a CSW answer has none; entity declarations "
                                  "there can expand a small answer into gigabytes)") from None
            found = exception_of(root)
            if found is not None:
                code, text = found
                text = self.forbidden.restore(text)[0]
                raise CswError(f"{shown}: the CSW answered an ExceptionReport: exceptionCode {code or '(none)'}"
                               f"{': ' + text if text else ''}", code, text)
            if resp.status_code >= 300:
                raise SourceError(f"{shown}: GET {scrub_url(resp.url)}: HTTP {resp.status_code}")
            return root

        try:
            return self.fetcher.get(url, params=params, headers={"Accept": "application/xml, text/xml"}, parse=parse,
                                    what=f"{shown}: GET {scrub_url(url)}")
        except CswError as exc:
            if filtered:
                raise FilterRejected(str(exc)) from exc
            raise

    # -- listing
    def _mapped(self, element: ET.Element) -> DatasetRecord:
        if element.tag in _DC_ROOTS:
            return dc_record(element, self.record_url)
        return iso_record(element, self.record_url, self.language)

    def _record(self, element: ET.Element) -> DatasetRecord:
        """The record of ``element``; on a page read with characters XML 1.0 forbids marked, one whose
        identifier holds one fails (never altered), another text holding one is read with U+FFFD
        and warned (sources/xml_chars.py)."""
        record = self._mapped(element)
        if not self.forbidden.met:
            return record
        if self.forbidden.marked(record.source_id):
            shown = self.forbidden.escaped(record.source_id)
            _, found = self.forbidden.restore(record.source_id)
            where = "dc:identifier" if element.tag in _DC_ROOTS else "gmd:fileIdentifier"
            return failed(shown, {"id": shown}, [forbidden_identifier(shown, found, where)])
        found = self.forbidden.restore_element(element)
        if found:
            record = self._mapped(element)
            if record.ok:
                record = replace(record, problems=record.problems + (forbidden_warning(record.source_id, found),))
        return record

    def iter_pages(self, since: datetime | None = None, page_size: int = 100) -> Iterator[list[DatasetRecord]]:
        for elements, _ in self._pages(since, page_size, "full"):
            records = [self._record(e) for e in elements]
            if since is not None:
                self._check_filter(records, since)
            fresh = self._fresh(records)
            self.listed += len(fresh)
            if fresh:
                yield fresh

    def _fresh(self, records: list[DatasetRecord]) -> list[DatasetRecord]:
        """The records not listed before in this listing (a record on two pages counts once)."""
        fresh = []
        for record in records:
            if record.source_id is not None:
                if record.source_id in self._seen_ids:
                    continue
                self._seen_ids.add(record.source_id)
            fresh.append(record)
        return fresh

    def _pages(self, since: datetime | None, page_size: int, element_set: str) -> Iterator[tuple[list, str]]:
        """(the record elements, the elementSet the answer says it holds) of each GetRecords page."""
        self.pages = self.listed = 0
        self.loop_cut = self.complete = False
        self._seen_ids: set[str] = set()
        seen_starts: set[int] = set()
        start = 1
        page_size = max(1, min(int(page_size or 100), 1000))
        while True:
            if start in seen_starts:
                log.warning("%s: nextRecord %d came round again; listing cut there", self.label, start)
                self.loop_cut = True
                return
            if self.pages >= self.max_pages:
                log.warning("%s: more than %d pages; listing stopped before record %d", self.label,
                            self.max_pages, start)
                return
            seen_starts.add(start)
            root = self._get(self.getrecords_params(start, page_size, since, element_set), f"GetRecords from {start}",
                             filtered=since is not None)
            self.pages += 1
            results = root.find("csw:SearchResults", NS)
            if results is None:
                raise SourceError(f"{self.label}: the GetRecords answer from {start} has no "
                                  f"csw:SearchResults (root {short(root.tag)})")
            matched = _int(results.get("numberOfRecordsMatched"))
            if self.pages == 1 or matched is not None:
                self.total = matched
            elements = records_of(root)
            yield elements, (results.get("elementSet") or "").strip().lower()
            returned = _int(results.get("numberOfRecordsReturned"))
            returned = len(elements) if returned is None else returned
            nxt = _int(results.get("nextRecord"))
            if nxt is None:
                # no nextRecord: numberOfRecordsMatched (exact) says where the end is; with neither,
                # only an empty page does (a short one is no proof: the server may cap maxRecords)
                if matched is not None:
                    nxt = start + returned if start + returned <= matched else 0
                else:
                    nxt = start + returned if returned else 0
            if nxt == 0 or (matched is not None and nxt > matched):
                self.complete = True
                return
            if nxt <= start or returned == 0:
                log.warning("%s: nextRecord %d after the page from %d (%d returned) does not advance; listing cut "
                            "there", self.label, nxt, start, returned)
                self.loop_cut = True
                return
            start = nxt

    def _check_filter(self, records: list[DatasetRecord], since: datetime) -> None:
        since = since.replace(tzinfo=timezone.utc) if since.tzinfo is None else since.astimezone(timezone.utc)
        for record in records:
            if record.metadata_modified is not None and record.metadata_modified < since - _FILTER_SLACK:
                raise FilterRejected(
                    f"{self.label}: the CSW ignored the modified-since filter: record {record.source_id!r} "
                    f"was modified {record.metadata_modified.isoformat()}, before {since.isoformat()}")

    def iter_records(self, since: datetime | None = None, page_size: int | None = None,
                     listing: Listing | None = None, validators: dict | None = None) -> Iterator[list[DatasetRecord]]:
        """``base.Source``: the records modified since ``since`` (all when None)."""
        yield from self.iter_pages(since, page_size or 100)
        if listing is not None:
            listing.complete = self.complete and since is None

    def _by_id(self, params: dict, what: str) -> ET.Element | None:
        """A GetRecordById answer; None for a ``NotFound`` ExceptionReport (pycsw's CSW 3 answer
        when none of the ids is held)."""
        try:
            return self._get(params, what)
        except CswError as exc:
            if exc.code == "NotFound":
                return None
            raise

    def fetch_by_id(self, record_id: str) -> DatasetRecord | None:
        """One record by GetRecordById (None when the catalogue does not have it)."""
        params = {"service": "CSW", "version": "2.0.2", "request": "GetRecordById", "id": record_id,
                  "elementSetName": "full", "outputSchema": SCHEMAS[self.schema]}
        root = self._by_id(params, f"GetRecordById {record_id}")
        found = records_of(root) if root is not None else []
        return self._record(found[0]) if found else None

    # -- reconciliation (sources/base.py) ------------------------------------------------------------
    def count(self) -> int | None:
        """``numberOfRecordsMatched`` of one ``resultType=hits`` GetRecords (no records sent)."""
        root = self._get(self.getrecords_params(1, 1, None, "brief", "hits"), "GetRecords hits")
        results = root.find("csw:SearchResults", NS)
        return _int(results.get("numberOfRecordsMatched")) if results is not None else None

    def list_ids(self, page_size: int) -> Iterator[IdPage]:
        """Every record's id and modification time, from ``elementSetName=summary`` pages (ISO
        summary keeps ``dateStamp``, Dublin Core's SummaryRecord ``dct:modified``; ``brief`` drops
        both). A page whose answer says it holds full records (the element set ignored) gives them
        whole in ``records``."""
        for elements, element_set in self._pages(None, page_size or 100, "summary"):
            ids, unusable, whole = [], 0, []
            for element in elements:
                source_id, modified = self._id_and_modified(element)
                source_id = self.forbidden.escaped(source_id)  # (as its failed record has it)
                if not source_id:
                    unusable += 1
                    continue
                if source_id in self._seen_ids:
                    continue
                self._seen_ids.add(source_id)
                ids.append((source_id, to_ms(modified) if modified else None))
                if element_set == "full":
                    whole.append(self._record(element))
            yield IdPage(ids, unusable, whole, "elementSetName=summary" if whole else "")
        if not self.complete:
            # (issue 36) a cut listing lacks datasets the portal still has: reconciling with it
            # would remove them
            raise SourceError(f"{self.label}: the identifier listing was cut short ({self.pages} pages read, see the "
                              f"warning above); an incomplete listing cannot be reconciled with")

    @staticmethod
    def _id_and_modified(element: ET.Element) -> tuple[str, datetime | None]:
        if element.tag in _DC_ROOTS:
            source_id = (element.findtext("dc:identifier", "", NS) or "").strip()
            value = element.findtext("dct:modified", None, NS) or element.findtext("dc:date", None, NS)
        else:
            source_id = (element.findtext("gmd:fileIdentifier/gco:CharacterString", "", NS) or "").strip()
            value = (element.findtext("gmd:dateStamp/gco:DateTime", None, NS)
                     or element.findtext("gmd:dateStamp/gco:Date", None, NS))
        return source_id, parse_timestamp((value or "").strip() or None)

    def fetch_by_ids(self, ids: list[str], per_request: int = 100) -> Iterator[list[DatasetRecord]]:
        """The records of ``ids`` by GetRecordById (comma-separated ids, ``per_request`` a request);
        ids the catalogue no longer has are left out."""
        per_request = max(1, per_request)
        for i in range(0, len(ids), per_request):
            chunk = ids[i:i + per_request]
            params = {"service": "CSW", "version": "2.0.2", "request": "GetRecordById", "id": ",".join(chunk),
                      "elementSetName": "full", "outputSchema": SCHEMAS[self.schema]}
            root = self._by_id(params, f"GetRecordById of {len(chunk)} ids")
            if root is None:
                continue
            wanted = set(chunk)
            records = [r for r in (self._record(e) for e in records_of(root)) if r.source_id in wanted]
            if records:
                yield records
