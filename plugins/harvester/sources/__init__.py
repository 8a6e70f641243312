"""Where datasets come from: one module per kind of portal, behind the protocol of base.py.

``type:`` in portals.yaml picks the kind: ``ckan`` (the Action API), ``dcat-json`` (a DCAT-US /
DCAT-AR ``data.json`` catalogue), ``dcat-rdf`` (a DCAT-AP catalogue in RDF/XML, Turtle or JSON-LD,
Hydra-paged), ``socrata`` (the Discovery API), ``opendatasoft`` (the Explore API v2.1),
``arcgis-hub`` (the Hub's OGC API Records search), ``csw`` (OGC CSW 2.0.2), ``iso-waf`` (ISO 19139 /
19115-2 files in a Web Accessible Folder), ``udata`` (udata's REST API v1), ``dcat-sparql`` (DCAT
over a SPARQL endpoint), ``stac`` (a STAC API's collections or a static catalog), ``sdmx`` (an SDMX
REST service's dataflows) and ``oai-pmh`` (an OAI-PMH 2.0 repository). Adding a kind is
one name in config/portals.py's PORTAL_TYPES, one module here and one entry below.
"""
from __future__ import annotations

import logging

from harvester.config.portals import (ARCGIS_HUB, CKAN, CSW, DCAT_JSON, DCAT_RDF, DCAT_SPARQL, ISO_WAF, OAI_PMH,
                                      OPENDATASOFT, PORTAL_TYPES, RECONCILE_TYPES, SDMX, SOCRATA, STAC, UDATA)
from harvester.sources.base import (EXACT_COUNT, NO_COUNT, Capabilities, FilterRejected, Listing, Source, SourceError,
                                    SourceUnavailable, capped_count)
# (a portal's JSON of any depth: what uploaded documents are read with too, pipeline/validate.py)
from harvester.sources.json_stream import loads as json_loads

log = logging.getLogger(__name__)

__all__ = ["CAPABILITIES", "Capabilities", "FilterRejected", "Listing", "Source", "SourceError", "SourceUnavailable",
           "as_source", "count_kind", "json_loads", "source_for"]

# Socrata's resultSetSize stops here (sources/socrata.py COUNT_CAP; tests/sources/test_socrata.py
# checks that the two say the same).
SOCRATA_COUNT_CAP = 10_000

# What each kind can do (sources/base.py): begin() plans runs with it before any request is made.
# ``count``: how far the kind's own count can be trusted, from each platform's documentation and
# recorded answers (../shared/portal-samples/*/README.md): CKAN's ``count`` (Solr's numFound),
# ArcGIS Hub's ``numberMatched``, CSW's ``numberOfRecordsMatched`` and OpenDataSoft's
# ``total_count`` are exact; Socrata's ``resultSetSize`` stops at 10,000 (the 2025 answers say
# exactly 10000 for queries that match more; 2018's said 150680); the DCAT kinds give none.
CAPABILITIES = {
    CKAN: Capabilities(incremental=True, reconcile=True, count=EXACT_COUNT),
    DCAT_JSON: Capabilities(conditional=True),
    DCAT_RDF: Capabilities(),
    ARCGIS_HUB: Capabilities(incremental=True, reconcile=True, count=EXACT_COUNT),
    # an OGC Filter on apiso:Modified / dct:modified (sources/csw.py)
    CSW: Capabilities(incremental=True, reconcile=True, count=EXACT_COUNT),
    # no modified-since filter; ordered by updatedAt (sources/socrata.py)
    SOCRATA: Capabilities(reconcile=True, count=capped_count(SOCRATA_COUNT_CAP)),
    OPENDATASOFT: Capabilities(incremental=True, reconcile=True, count=EXACT_COUNT),  # ODSQL where on default.modified
    # the listing's date of each file; the walk of the folders lists every file; undated files
    # asked with their ETag / Last-Modified; a retried fetch resumes (sources/iso_waf.py)
    ISO_WAF: Capabilities(incremental=True, conditional=True, reconcile=True, count=NO_COUNT, resumable=True),
    # newest first by last_update, stopping at the watermark; Page.total (sources/udata.py)
    UDATA: Capabilities(incremental=True, reconcile=True, count=EXACT_COUNT),
    # a FILTER on dct:modified, keyset paging, a COUNT query (sources/dcat_sparql.py)
    DCAT_SPARQL: Capabilities(incremental=True, reconcile=True, count=EXACT_COUNT),
    # no modified-since filter: every run reads every collection (sources/stac.py)
    STAC: Capabilities(),
    # one structure message of every dataflow, If-Modified-Since (sources/sdmx.py)
    SDMX: Capabilities(conditional=True),
    # from= on the datestamp, ListIdentifiers / GetRecord; no count: completeListSize is optional and
    # an estimate on some servers (sources/oai_pmh.py)
    OAI_PMH: Capabilities(incremental=True, reconcile=True, count=NO_COUNT),
}
assert set(CAPABILITIES) == set(PORTAL_TYPES), "every kind of portal (config/portals.py PORTAL_TYPES) needs an entry"
assert {kind for kind, can in CAPABILITIES.items() if can.reconcile} == set(RECONCILE_TYPES), \
    "config/portals.py RECONCILE_TYPES (the kinds that take reconcile_every) must be those whose Capabilities reconcile"


def count_kind(portal, source: Source):
    """How far the count of ``portal``'s kind can be trusted (Capabilities.count): the kind's entry
    above, else (a kind unknown here) the source's own."""
    can = CAPABILITIES.get(getattr(portal, "type", None))
    return can.count if can is not None else source.capabilities.count


def source_for(portal, **overrides) -> Source:
    """The portal's source, with its settings and credentials: the token of its ``conn_id``, looked
    up in Airflow, in the header its ``auth_header`` says (each platform's own: CKAN's
    ``Authorization``, Socrata's ``X-App-Token``, OpenDataSoft's ``Authorization: Apikey``,
    ArcGIS's ``X-Esri-Authorization: Bearer``; for DCAT and CSW the one portals.yaml names), else a
    user:password from the url as Basic auth (a token takes its place)."""
    if portal.type == CKAN:
        from harvester.config.credentials import api_key
        from harvester.sources.ckan import CkanClient, CkanSource

        settings = {"politeness_delay": portal.politeness_delay, "max_retries": portal.max_retries,
                    "timeout": portal.timeout, "api_key": api_key(portal), "basic_auth": portal.credentials,
                    **overrides}
        return CkanSource(CkanClient(portal.url, **settings), portal.url)
    from harvester.config.credentials import auth_header
    from harvester.http import HttpFetcher

    header = auth_header(portal)
    if header and portal.credentials:
        log.warning("%s: a token is given (conn_id), so the user:password for the portal is not used", portal.name)
    settings = {"politeness_delay": portal.politeness_delay, "max_retries": portal.max_retries,
                "timeout": portal.timeout, "header_auth": header,
                "basic_auth": None if header else portal.credentials, **overrides}
    fetcher = HttpFetcher(portal.url, **settings)
    if portal.type == DCAT_JSON:
        from harvester.sources.dcat_json import DcatJsonSource

        return DcatJsonSource(portal.url, fetcher=fetcher, schema_profile=portal.dcat_us_profile)
    if portal.type == DCAT_RDF:
        from harvester.sources.dcat_rdf import DcatRdfSource

        return DcatRdfSource(portal.url, fetcher=fetcher, language=portal.language_code)
    if portal.type == ARCGIS_HUB:
        from harvester.sources.arcgis_hub import ArcGisHubSource

        return ArcGisHubSource(portal.url, fetcher=fetcher, portal=portal.name)
    if portal.type == SOCRATA:
        from harvester.sources.socrata import SocrataSource

        return SocrataSource(portal.url, fetcher=fetcher, portal=portal.name)
    if portal.type == CSW:
        from harvester.sources.csw import CswSource

        return CswSource(portal.url, fetcher=fetcher, language=portal.language_code, portal=portal.name)
    if portal.type == OPENDATASOFT:
        from harvester.sources.opendatasoft import OpenDataSoftSource

        return OpenDataSoftSource(portal.url, fetcher=fetcher)
    if portal.type == ISO_WAF:
        from harvester.sources.iso_waf import IsoWafSource

        return IsoWafSource(portal.url, fetcher=fetcher, portal=portal)
    if portal.type == UDATA:
        from harvester.sources.udata import UdataSource

        return UdataSource(portal.url, fetcher=fetcher, portal=portal)
    if portal.type == DCAT_SPARQL:
        from harvester.sources.dcat_sparql import DcatSparqlSource

        return DcatSparqlSource(portal.url, fetcher=fetcher, portal=portal)
    if portal.type == STAC:
        from harvester.sources.stac import StacSource

        return StacSource(portal.url, fetcher=fetcher, portal=portal)
    if portal.type == SDMX:
        from harvester.sources.sdmx import SdmxSource

        return SdmxSource(portal.url, fetcher=fetcher, portal=portal)
    if portal.type == OAI_PMH:
        from harvester.sources.oai_pmh import OaiPmhSource

        return OaiPmhSource(portal.url, fetcher=fetcher, portal=portal)
    raise ValueError(f"portal {portal.name}: type {portal.type!r} has no source; valid types are: "
                     f"{', '.join(PORTAL_TYPES)}")


def as_source(source_or_client, portal) -> Source:
    """A source as is; a bare CkanClient (tests, scripts) wrapped as the portal's CKAN source."""
    from harvester.sources.ckan import CkanClient, CkanSource

    if isinstance(source_or_client, CkanClient):
        return CkanSource(source_or_client, portal.url)
    return source_or_client
