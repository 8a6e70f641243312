"""OAI-PMH 2.0 repositories (sources/oai_pmh.py) over real HTTP to the local repository
(testing/oai_pmh_portal.py), which serves Zenodo's recorded records (../shared/portal-samples/oai-pmh/)
and catalogues derived from them: the mappings field by field, resumption tokens, from=, an expired
token restarting from the last datestamp, deleted headers, errors sent with HTTP 422, hostile
answers, reconciliation, portals.yaml's keys and `harvester validate`."""
from __future__ import annotations

import logging
import xml.etree.ElementTree as ET
from datetime import datetime, timedelta, timezone

import pytest

from harvester.config.portals import Portal, _portal
from harvester.http import HttpFetcher, RetriesExhausted
from harvester.http.guard import FetchPolicy
from harvester.pipeline import validate as v
from harvester.sources import source_for
from harvester.sources.base import Listing, SourceError
from harvester.sources.oai_pmh import NS, OaiError, OaiPmhSource, parse_xml, record_of
from harvester.testing.oai_pmh_portal import (DAY, OaiPmhServer, bomb_body, catalogue, derive, error_body,
                                              real_records)
from harvester.testing.samples import portal_sample

START = datetime(2024, 1, 1, tzinfo=timezone.utc)


def sample_records(name: str) -> list[ET.Element]:
    root = parse_xml(portal_sample("oai-pmh", name).read_bytes())
    return root.findall("oai:ListRecords/oai:record", NS)


def by_id(name: str) -> dict:
    return {r.source_id: r for r in (record_of(e, lambda i: f"getrecord:{i}") for e in sample_records(name))}


@pytest.fixture
def server():
    with OaiPmhServer(catalogue(250, START)) as srv:
        yield srv


def source(server, **kw) -> OaiPmhSource:
    fetcher = HttpFetcher(server.url, max_retries=kw.pop("max_retries", 2), backoff=0.01, max_backoff=0.05,
                          policy=kw.pop("policy", None))
    return OaiPmhSource(server.url, fetcher=fetcher, portal="zen", **kw)


def listed(src, since=None) -> tuple[list, Listing]:
    listing = Listing()
    return [r for page in src.iter_records(since, 100, listing) for r in page], listing


# -- mappings ------------------------------------------------------------------------------------
def test_zenodo_oai_dc_records_mapped_field_by_field():
    records = by_id("zenodo-listrecords-oai_dc-page1-2024-01-18.body.xml")
    rec = records["oai:zenodo.org:2217771"]
    assert (rec.title, rec.description, rec.organization) == ("Some Remarkable Oxidation-Products of Benzidine",
                                                             "n/a", "Zenodo")
    assert rec.url == "https://doi.org/10.1080/00359191009519377"
    assert rec.metadata_modified == datetime(2020, 1, 20, 17, 11, 12, tzinfo=timezone.utc)  # the header's datestamp
    assert rec.raw["license_id"] == "https://creativecommons.org/publicdomain/zero/1.0/legalcode"
    assert rec.raw["license_title"] == "Creative Commons Zero v1.0 Universal"
    extras = {e["key"]: e["value"] for e in rec.raw["extras"]}
    assert extras["access_right"] == "info:eu-repo/semantics/openAccess"
    assert extras["creator"] == "Moir, James" and extras["type"] == "info:eu-repo/semantics/article"
    assert extras["date"] == "1910-01-01"
    # the deleted header of page 1 (metadata and all, while Identify says deletedRecord no) is a deletion
    gone = records["oai:zenodo.org:2510668"]
    assert (gone.deleted, gone.title, gone.metadata_modified) == (
        True, "", datetime(2020, 1, 20, 13, 19, 30, tzinfo=timezone.utc))

    more = by_id("zenodo-listrecords-oai_dc-from-until-2024-01-18.body.xml")
    assert more["oai:zenodo.org:10517699"].language == "en"  # dc:language eng
    taxon = more["oai:zenodo.org:10517570"]
    assert {"Animalia", "Arthropoda", "Biodiversity"} <= set(taxon.tags)
    assert {e["key"]: e["value"] for e in taxon.raw["extras"]}["setSpec"] == "user-biosyslit"


def test_zenodo_datacite_records_mapped_with_their_languages():
    rec = by_id("zenodo-listrecords-datacite-page1-2024-01-18.body.xml")["oai:zenodo.org:1964765"]
    assert (rec.title, rec.url, rec.organization) == ("Origin of the Numerals", "https://doi.org/10.1038/012496b0",
                                                      "Zenodo")
    assert rec.raw["license_id"] == "https://creativecommons.org/publicdomain/zero/1.0/legalcode"
    extras = {e["key"]: e["value"] for e in rec.raw["extras"]}
    assert extras["creators/creator/creatorName"] == "Lyall, W.-M." and extras["publicationYear"] == "1875"
    # titles in several languages (xml:lang) are all kept; the record's language is datacite's
    element = sample_records("zenodo-listrecords-datacite-page1-2024-01-18.body.xml")[2]
    resource = element.find("oai:metadata", NS)[0]
    ns = resource.tag[1:].partition("}")[0]
    titles = resource.find(f"{{{ns}}}titles")
    titles[0].set("{http://www.w3.org/XML/1998/namespace}lang", "en")
    ET.SubElement(titles, f"{{{ns}}}title", {"{http://www.w3.org/XML/1998/namespace}lang": "fr",
                                            "titleType": "TranslatedTitle"}).text = "Origine des chiffres"
    ET.SubElement(resource, f"{{{ns}}}language").text = "fr"
    rec = record_of(element, str)
    assert rec.title == "Origin of the Numerals" and rec.language == "fr"
    assert rec.raw["translations"]["title"] == {"en": "Origin of the Numerals", "fr": "Origine des chiffres"}


def test_a_record_without_title_or_metadata_is_that_records_outcome():
    element = sample_records("zenodo-listrecords-oai_dc-page1-2024-01-18.body.xml")[0]
    dc = element.find("oai:metadata/oai_dc:dc", NS)
    dc.remove(dc.find("dc:title", NS))
    rec = record_of(element, str)
    assert rec.error and rec.problems[0].code == "no-title" and rec.source_id == "oai:zenodo.org:2217771"
    element.remove(element.find("oai:metadata", NS))
    assert record_of(element, str).problems[0].code == "invalid-record"


# -- listing ---------------------------------------------------------------------------------------
def test_a_full_listing_follows_exclusive_tokens_to_the_empty_one(server):
    src = source(server)
    records, listing = listed(src)
    assert [r.source_id for r in records] == [f"oai:local:{i}" for i in range(250)]
    assert listing.complete and src.total == 250
    requests = server.verb_requests("ListRecords")
    assert requests[0] == {"verb": "ListRecords", "metadataPrefix": "oai_dc"}
    assert [set(r) for r in requests[1:]] == [{"verb", "resumptionToken"}] * 2
    assert not server.verb_requests("Identify")  # a full listing needs no granularity
    assert src.requests_made == 3


def test_an_incremental_listing_sends_from_in_the_granularity_inclusive(server):
    src = source(server)
    since = START + timedelta(minutes=200)
    records, listing = listed(src, since)
    assert [r.source_id for r in records] == [f"oai:local:{i}" for i in range(200, 250)]  # 200 included
    assert server.verb_requests("ListRecords")[0]["from"] == "2024-01-01T03:20:00Z"
    assert not listing.complete and src.complete  # complete, but not the whole repository
    listed(src, since)
    assert len(server.verb_requests("Identify")) == 1  # asked once
    server.granularity = DAY
    day = source(server)
    before = len(server.verb_requests("ListRecords"))
    listed(day, since)
    assert server.verb_requests("ListRecords")[before]["from"] == "2024-01-01"


def test_no_records_match_is_an_empty_result_even_with_http_422(server):
    src = source(server)
    records, _ = listed(src, START + timedelta(days=30))
    assert records == [] and src.complete
    server.set_records([])
    records, listing = listed(src)
    assert records == [] and listing.complete


def test_a_set_and_a_metadata_prefix_are_sent_from_portals_yaml(server):
    records = catalogue(5, START)
    records[2].sets = ["user-local"]
    records.append(derive(real_records()[0], "oai:local:dc", datestamp=START + timedelta(hours=9)))
    server.set_records(records)
    portal = _portal({"name": "zen", "url": server.url, "type": "oai-pmh", "oai_set": "user-local",
                      "politeness_delay": 0})
    src = source_for(portal)
    assert isinstance(src, OaiPmhSource)
    assert [r.source_id for r in listed(src)[0]] == ["oai:local:2"]
    assert server.verb_requests("ListRecords")[-1]["set"] == "user-local"
    portal = _portal({"name": "zen", "url": server.url, "type": "oai-pmh", "oai_metadata_prefix": "datacite",
                      "politeness_delay": 0})
    got = listed(source_for(portal))[0]
    assert server.verb_requests("ListRecords")[-1]["metadataPrefix"] == "datacite"
    # (the records held in datacite: those derived from Zenodo's three datacite records)
    assert [r.title for r in got] == ["Some Remarkable Oxidation-Products of Benzidine #0", "Luminous Worms #1",
                                      "Origin of the Numerals #2", "Some Remarkable Oxidation-Products of Benzidine"]
    assert got[0].raw["schema"] == "datacite"
    with pytest.raises(Exception, match="oai_set applies to type oai-pmh only"):
        _portal({"name": "x", "url": "https://x.org/data.json", "oai_set": "a"})


def test_deleted_headers_are_deletions_and_not_live_ids(server):
    server.deleted_metadata = True  # as Zenodo sends them
    server.delete("oai:local:7", START + timedelta(days=2))
    records, listing = listed(source(server))
    gone = [r for r in records if r.deleted]
    assert [(r.source_id, r.metadata_modified) for r in gone] == [("oai:local:7", START + timedelta(days=2))]
    assert listing.complete and len(records) == 250
    ids = [i for page in source(server).list_ids(100) for i, _ in page.ids]
    assert len(ids) == 249 and "oai:local:7" not in ids
    assert {s for s in server.verb_requests("ListIdentifiers")[0]} == {"verb", "metadataPrefix"}


def test_an_expired_token_restarts_from_the_last_datestamp_seen(server, caplog):
    src = source(server)
    caplog.set_level(logging.WARNING, logger="harvester")
    pages = src.iter_records(None, 100, listing := Listing())
    first = next(pages)
    server.expire_tokens(1)
    records = first + [r for page in pages for r in page]
    assert sorted(r.source_id for r in records) == sorted(f"oai:local:{i}" for i in range(250))  # each once
    assert listing.complete and src.restarts == 1
    requests = server.verb_requests("ListRecords")
    # page 1, the refused token, then from = page 1's last datestamp (record 99's), not from the start:
    # records 99-198, then 199-249
    assert requests[2] == {"verb": "ListRecords", "metadataPrefix": "oai_dc", "from": "2024-01-01T01:39:00Z"}
    assert len(requests) == 4 and len(server.verb_requests("Identify")) == 1
    assert "badResumptionToken" in caplog.text and "listing again from 2024-01-01T01:39:00Z" in caplog.text


def test_a_restart_of_an_unordered_listing_is_not_proof_and_restarts_are_bounded(server):
    server.unordered = True  # Zenodo's pages are not in datestamp order
    src = source(server)
    pages = src.iter_records(None, 100, listing := Listing())
    next(pages)
    server.expire_tokens(1)
    list(pages)
    assert src.restarts == 1 and not listing.complete
    # restarts that move on are not bounded (a big repository's tokens may expire often); restarts
    # that get no further are: every record on one datestamp, a token refused every time
    server.unordered = False
    server.set_records(catalogue(250, START, step=timedelta(0)))
    server.expire_tokens(100)
    with pytest.raises(SourceError, match=r"the resumption token expired 6 times in a row without the listing getting "
                                          r"past 2024-01-01T00:00:00Z \(at most 5 restarts\)"):
        listed(source(server))


def test_a_token_that_comes_round_again_cuts_the_listing(server, caplog):
    server.loop_token = True
    caplog.set_level(logging.WARNING, logger="harvester")
    src = source(server)
    records, listing = listed(src)
    assert not listing.complete and src.cut and src.requests_made == 2 and len(records) == 200
    assert "came round again" in caplog.text
    with pytest.raises(SourceError, match="identifier listing was cut short"):
        list(source(server).list_ids(100))


# -- errors and hostile answers --------------------------------------------------------------------
def test_oai_errors_are_named_and_terminal(server):
    server.canned = (422, error_body("badArgument", "Illegal argument"))
    with pytest.raises(OaiError, match="OAI-PMH error badArgument: Illegal argument \\(HTTP 422\\)") as err:
        listed(source(server))
    assert err.value.code == "badArgument" and len(server.requests) == 1  # not retried
    server.canned = (200, error_body("cannotDisseminateFormat", "oai_dc"))
    with pytest.raises(OaiError, match="cannotDisseminateFormat"):
        listed(source(server))
    server.canned = (200, b"<?xml version='1.0'?><feed xmlns='http://www.w3.org/2005/Atom'/>")
    with pytest.raises(SourceError, match="not an OAI-PMH answer .*root element 'feed'"):
        listed(source(server))


def test_transient_faults_are_retried_and_a_page_that_is_not_xml_too(server):
    server.fail_next(2, 503, retry_after="0")
    src = source(server)
    records, listing = listed(src)
    assert len(records) == 250 and listing.complete and src.requests_made == 5
    server.canned = (200, b"<html><body>Maintenance<br></body></html>")
    with pytest.raises(RetriesExhausted, match="the answer is not XML"):
        listed(source(server, max_retries=1))


def test_an_xml_bomb_is_refused_unread(server):
    server.canned = (200, bomb_body())
    with pytest.raises(SourceError, match="declares a DOCTYPE .*refused unread"):
        listed(source(server))


def test_an_answer_that_never_ends_is_cut_at_the_size_cap(server):
    server.endless = True
    policy = FetchPolicy.for_harvest(server.url, environ={"HARVESTER_FETCH_MAX_BYTES": "2MB",
                                                          "HARVESTER_FETCH_ALLOW_PRIVATE": "true"})
    with pytest.raises(SourceError, match="2 MB|2MB|2.0 MB|larger"):
        listed(source(server, policy=policy, max_retries=0))


# -- reconciliation ------------------------------------------------------------------------------
def test_list_ids_and_fetch_by_ids(server):
    src = source(server)
    pages = list(src.list_ids(100))
    ids = [i for p in pages for i in p.ids]
    assert len(ids) == 250 and ids[0] == ("oai:local:0", START) and len(pages) == 3
    got = [r for p in src.fetch_by_ids(["oai:local:3", "oai:local:nope", "oai:local:9"]) for r in p]
    assert [r.source_id for r in got] == ["oai:local:3", "oai:local:9"]
    assert got[0].metadata_modified == START + timedelta(minutes=3)  # what list_ids said
    assert src.count() is None


# -- validation ------------------------------------------------------------------------------------
def test_harvester_validate_reads_the_first_pages_and_a_saved_answer(server, tmp_path):
    report = v.validate_url(server.url, "oai-pmh", pages=2)
    assert (report.records, report.failed, report.complete) == (200, 0, False)
    saved = tmp_path / "listrecords.xml"
    saved.write_bytes(portal_sample("oai-pmh", "zenodo-listrecords-oai_dc-page1-2024-01-18.body.xml").read_bytes())
    report = v.validate_path(saved, "oai-pmh")
    assert (report.records, report.failed) == (2, 0)  # the deleted header is no record
