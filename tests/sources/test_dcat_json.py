"""The DCAT data.json source (harvester.sources.dcat_json) on the real catalogues in
../shared/dcat-samples: mapping to CKAN-shaped packages, streaming, failed entries, and the
conditional GET against a real HTTP server on 127.0.0.1."""
from __future__ import annotations

import copy
import gzip
import hashlib
import io
import json
import threading
import tracemalloc
import zlib
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from harvester.domain.dataset import content_hash, embedding_text, normalize_url, sha256_hex, tracked_metadata
from harvester.sources.base import Listing, SourceError, SourceUnavailable
from harvester.sources.dcat_json import (DcatJsonSource, InvalidCatalogue, iter_entries, iter_records, normalize, to_package)
from harvester.http import HttpFetcher
from harvester.testing.dcat_portal import DcatServer
from harvester.testing.local_http import dumps, nested
from harvester.testing.samples import dcat_samples_dir, existing, load_json

DCAT = dcat_samples_dir()
AR = DCAT / "datos-gob-ar"
US = DCAT / "dcat-us"
CATALOG = "https://catalog.example.org/data.json"
sample = existing


def parse(path: Path, url: str = CATALOG) -> list:
    with open(sample(path), "rb") as handle:
        return list(iter_records(handle, url))


def entry(path: Path, identifier: str) -> dict:
    return copy.deepcopy(next(e for e in load_json(path)["dataset"] if e.get("identifier") == identifier))


AR_SNAPSHOTS = ["data.json-2018-04-16.json.gz", "data.json-2018-06-26.json.gz", "data.json-2018-07-04.json.gz",
                "data.json-2018-07-05.json.gz", "data.json-2018-07-10.json.gz"]


# -- the real datos.gob.ar snapshots ----------------------------------------------------------------
@pytest.mark.parametrize("name", AR_SNAPSHOTS)
def test_every_datos_gob_ar_snapshot_parses_to_all_its_datasets(name):
    expected = load_json(AR / name)["dataset"]
    with gzip.open(sample(AR / name), "rb") as handle:
        records = list(iter_records(handle, "http://datos.gob.ar/data.json"))
    assert len(records) == len(expected) > 600
    assert [r.error for r in records if not r.ok] == []
    assert [r.source_id for r in records] == [e["identifier"].strip() for e in expected]
    for record, raw in zip(records, expected):
        assert record.title and record.title == " ".join(raw["title"].split())
        assert record.content_hash == content_hash(embedding_text(record.title, record.description))
        assert record.metadata_hash and record.url_hash
        assert record.organization == raw["publisher"]["name"].strip()


def test_a_gzip_file_is_recognised_without_being_told():
    with open(sample(AR / AR_SNAPSHOTS[0]), "rb") as handle:  # the .gz bytes as they are
        ids = [r.source_id for r in iter_records(handle, "http://datos.gob.ar/data.json")]
    assert ids == [e["identifier"] for e in load_json(AR / AR_SNAPSHOTS[0])["dataset"]]


def test_a_landing_page_that_is_not_a_url_gives_the_catalogue_address():
    # One real 2018-04-16 entry has an office's name for a landing page.
    records = parse(AR / AR_SNAPSHOTS[0], "http://datos.gob.ar/data.json")
    odd = [e for e in load_json(AR / AR_SNAPSHOTS[0])["dataset"] if not e["landingPage"].startswith("http")]
    assert len(odd) == 1
    record = next(r for r in records if r.source_id == odd[0]["identifier"])
    assert record.url == f"http://datos.gob.ar/data.json#{odd[0]['identifier']}"
    urls = [r.url_hash for r in records if not r.url.startswith("http://datos.gob.ar/data.json#")]
    assert record.url_hash not in urls


@pytest.mark.parametrize("before,after", list(zip(AR_SNAPSHOTS[1:], AR_SNAPSHOTS[2:])))
def test_an_entry_changes_its_hashes_exactly_when_it_changed(before, after):
    """Consecutive real snapshots: a dataset's hashes change exactly when its entry changed in
    anything but its ``modified`` date (a file's own modified date, a column's description, a
    distribution added: every edit is seen), and its content hash only when its text changed."""
    def body(entry):
        return {k: v for k, v in entry.items() if k != "modified"}

    def text(entry):
        return " ".join(entry["title"].split()), " ".join(entry["description"].split())

    old_entries = {e["identifier"]: e for e in load_json(AR / before)["dataset"]}
    new_entries = {e["identifier"]: e for e in load_json(AR / after)["dataset"]}
    old = {r.source_id: r for r in parse(AR / before)}
    new = {r.source_id: r for r in parse(AR / after)}
    common = old_entries.keys() & new_entries.keys()
    edited = {i for i in common if body(old_entries[i]) != body(new_entries[i])}
    assert 0 < len(edited) < len(common)
    assert {i for i in common if old[i].metadata_hash != new[i].metadata_hash
            or old[i].content_hash != new[i].content_hash} == edited
    assert {i for i in common if old[i].content_hash != new[i].content_hash} == \
        {i for i in common if text(old_entries[i]) != text(new_entries[i])}


# -- the DCAT-US catalogues, broken ones included -----------------------------------------------------
# file -> (usable records, [(source_id of a failed record, words its reason must contain)]). DCAT-US
# catalogues are also held to their schema (tests/sources/test_dcat_us_validation.py checks every
# entry against it independently): a 1.1 entry without the description or with a null modified
# date, a 3.0 one without a contactPoint, a description over 10,000 characters fail.
EXPECTED_US = {
    "dcatus.json": (7, []),
    "dcatus_2.json": (3, []),
    "dcatus3_0.json": (3, [(None, ["Test Dataset Four", "identifier", "'@id'"])]),
    "dcatus3_0_invalid.json": (1, [("https://example.gov/datasets/invalid",
                                    ["Invalid Dataset (missing contactPoint)", "contactPoint", "required"])]),
    "dcatus3_0_nested_catalog.json": (3, []),
    "dcatus3_0_no_identifier.json": (0, [(None, ["Dataset With Invalid Object Identifier", "'@id'"])]),
    "dcatus3_0_record_no_id.json": (1, []),
    "dcatus3_0_series_member_also_top_level.json": (2, []),
    "dcatus3_0_series_with_members.json": (2, []),
    "dcatus3_0_service_no_identifier.json": (1, []),
    "dcatus3_0_service_serves_dataset.json": (1, []),
    "dcatus3_0_warning.json": (3, []),
    "dcatus3_0_with_records.json": (1, []),
    "dcatus3_0_with_services.json": (1, []),
    "dcatus_bad_license_uri.json": (0, [("https://www.arcgis.com/home/item.html?id=99731bb0369848169d98f31ce83fb0e2",
                                         ["Veterans Honor Map Locations", "license", "HTML"])]),
    "dcatus_long_description.json": (0, [("USGS:72823231-40c4-4cb2-833a-609c97e474ba",
                                          ["Klamath Basin", "description", "longer than 10000 characters"])]),
    "dcatus_multiple_invalid.json": (0, [("https://www.arcgis.com/home/item.html?id=99731bb0369848169d98f31ce83fb0e2",
                                          ["Veterans Honor Map Locations", "license"])]),
    "dcatus_no_identifier.json": (0, [(None, ["Commitment of Traders", "no identifier", "landing page"])]),
    "dcatus_same_title.json": (2, []),
    "dcatus_same_title_step_2.json": (2, []),
    "dcatus_single_record.json": (1, []),
    "dcatus_single_record_non-federal.json": (1, []),
    "dcatus_spatial_no_translate.json": (1, []),
    # the Philadelphia catalogue: 391 of its 402 entries have "modified": null, which 1.1 forbids
    "dcatus_with_none.json": (11, "modified is null"),
    "missing_title.json": (0, [("null-spatial", ["null-spatial", "no title"])]),
    "ckanext-datajson/arm.data.json": (3, []),
    "ckanext-datajson/collection-1-parent-2-children.data.json": (3, []),
    "ckanext-datajson/collection-2-parent-4-children.data.json": (6, []),
    "ckanext-datajson/geospatial.data.json": (2, []),
    "ckanext-datajson/large-spatial.data.json": (1, []),
    "ckanext-datajson/many-resources.data.json": (1, []),
    "ckanext-datajson/missing-catalog.data.json": (1, [(None, ["entry 1", "no identifier", "no title"])]),
    "ckanext-datajson/missing-dataset-fields.data.json": (0, [(None, ["entry 1", "no identifier", "no title"]),
                                                              ("IDF6-OPM-0001", ["Employee Relations Roundtables",
                                                                                 "description: required"])]),
    "ckanext-datajson/missing-identifier-title.data.json": (1, [(None, ["simple test title", "no identifier"]),
                                                                ("Test-0002", ["Test-0002", "no title"])]),
    "ckanext-datajson/null-spatial.data.json": (1, []),
    "ckanext-datajson/numerical-title.data.json": (0, [("null-spatial", ["title is a number"])]),
    "ckanext-datajson/ny.data.json": (1, []),
    "ckanext-datajson/reserved-title.data.json": (1, []),
    "ckanext-datajson/usda.gov.data.json": (3, []),
}


def test_every_dcat_us_sample_is_in_the_table():
    found = {str(p.relative_to(US)) for p in sample(US).rglob("*.json")}
    assert found == set(EXPECTED_US)


@pytest.mark.parametrize("name", sorted(EXPECTED_US))
def test_dcat_us_samples_fail_exactly_their_broken_entries(name):
    usable, failures = EXPECTED_US[name]
    if failures == "modified is null":  # too many to list: every entry whose modified date is null
        failures = [(e["identifier"], [e["title"][:40], "modified: null"]) for e in load_json(US / name)["dataset"]
                    if e.get("modified", "") is None]
        assert len(failures) == 391
    records = parse(US / name)
    assert sum(r.ok for r in records) == usable
    failed = [r for r in records if not r.ok]
    assert len(failed) == len(failures)
    for record, (source_id, words) in zip(failed, failures):
        assert record.source_id == source_id
        for word in words:
            assert word in record.error, (word, record.error)
    ids = [r.source_id for r in records if r.ok]
    assert len(ids) == len(set(ids))


def test_nested_catalogues_and_series_give_each_dataset_once():
    nested = {r.source_id for r in parse(US / "dcatus3_0_nested_catalog.json")}
    assert nested == {f"https://example.gov/datasets/nested-{k}" for k in ("parent", "child", "grandchild")}
    series = parse(US / "dcatus3_0_series_member_also_top_level.json")
    assert [r.source_id for r in series] == ["https://example.gov/datasets/annual-report-2023",
                                             "https://example.gov/datasets/annual-report-2024"]
    # the catalogue's own listing comes first and is the copy kept
    assert series[0].description == "The first dataset in the series, also listed at the catalog's top level."
    served = parse(US / "dcatus3_0_service_serves_dataset.json")
    assert [r.source_id for r in served] == ["https://example.gov/datasets/served-by-service-one"]


def test_an_object_identifier_gives_its_at_id():
    records = parse(US / "dcatus3_0.json")
    assert records[2].source_id == "https://example.gov/datasets/three"
    assert {"key": "identifier", "value": json.dumps({"@id": "https://example.gov/datasets/three",
                                                      "@type": "Identifier"}, separators=(",", ":"))} \
        in records[2].raw["extras"]


def test_a_long_description_is_embedded_up_to_the_cap_and_hashed_whole():
    raw = load_json(US / "dcatus_long_description.json")["dataset"][0]
    # the mapping alone: DCAT-US 1.1 caps a description at 10,000 characters, so in its catalogue
    # (schema-checked) this entry fails (EXPECTED_US)
    record = normalize(raw, CATALOG)
    assert record.ok and len(record.description) > 50000
    edited = copy.deepcopy(raw)
    edited["description"] = raw["description"][:-200] + "an edit near the end"
    other = normalize(edited, CATALOG)
    assert other.content_hash == record.content_hash  # beyond the embedded text's cap
    assert other.metadata_hash != record.metadata_hash  # but still a change of the dataset


# -- the mapping on real entries --------------------------------------------------------------------
def test_a_datos_gob_ar_entry_maps_to_a_ckan_package():
    raw = entry(AR / "data.json-2018-07-10.json.gz", "sspm_38")
    pkg = to_package(raw, "http://datos.gob.ar/data.json")
    assert pkg["id"] == "sspm_38" and pkg["title"] == raw["title"] and pkg["notes"] == raw["description"]
    assert [t["name"] for t in pkg["tags"]] == raw["keyword"]
    assert pkg["organization"]["title"] == raw["publisher"]["name"]
    assert pkg["organization"]["name"] == "subsecretaria-de-programacion-macroeconomica"
    assert [g["name"] for g in pkg["groups"]] == raw["theme"]
    assert pkg["resources"] == [{"url": d["downloadURL"], "format": d["format"], "name": d["title"]}
                                for d in raw["distribution"]]
    assert pkg["license_id"] == raw["license"]
    assert (pkg["metadata_modified"], pkg["issued"], pkg["temporal"], pkg["url"]) == \
        (raw["modified"], raw["issued"], raw["temporal"], raw["landingPage"])
    extras = {e["key"]: e["value"] for e in pkg["extras"]}
    plain = {"source", "contactPoint", "superTheme", "language", "accrualPeriodicity"}
    assert {k for k in extras if not k.startswith(("publisher.", "distribution["))} == plain
    assert extras["source"] == raw["source"] and extras["accrualPeriodicity"] == "R/P1M"
    assert json.loads(extras["contactPoint"]) == raw["contactPoint"] and extras["superTheme"] == '["ECON"]'
    # what the organization and the resources do not hold, key by key
    assert extras["publisher.mbox"] == raw["publisher"]["mbox"]
    for dist in raw["distribution"]:
        for key, value in dist.items():
            if key not in ("downloadURL", "format", "title", "identifier"):
                got = extras[f"distribution[{dist['identifier']}].{key}"]
                assert (got if isinstance(value, str) else json.loads(got)) == value

    record = normalize(raw, "http://datos.gob.ar/data.json")
    assert record.url == raw["landingPage"] and record.url_hash == sha256_hex(normalize_url(raw["landingPage"]))
    assert record.tags == sorted(raw["keyword"]) and record.organization == raw["publisher"]["name"]
    assert record.metadata_modified == datetime(2018, 7, 6, 3, 45, 0, 709616, tzinfo=timezone.utc)
    tracked = tracked_metadata(record.raw)  # what change detection and the search keys read
    assert tracked["license"] == raw["license"] and tracked["groups"] == ["econ"]
    assert {r["format"] for r in tracked["resources"]} == {"CSV"}
    assert tracked["extras"]["accrualPeriodicity"] == "R/P1M"


def test_the_hashes_tell_metadata_from_content():
    raw = entry(AR / "data.json-2018-07-10.json.gz", "sspm_38")
    base = normalize(raw, CATALOG)
    moved = copy.deepcopy(raw)
    moved["distribution"][1]["downloadURL"] += "?v=2"
    assert (normalize(moved, CATALOG).metadata_hash, normalize(moved, CATALOG).content_hash) != \
        (base.metadata_hash, base.content_hash)
    assert normalize(moved, CATALOG).content_hash == base.content_hash
    periodic = copy.deepcopy(raw)
    periodic["accrualPeriodicity"] = "R/P1Y"  # an unmapped key: an extra
    assert normalize(periodic, CATALOG).metadata_hash != base.metadata_hash
    retitled = copy.deepcopy(raw)
    retitled["title"] += " (revisado)"
    assert normalize(retitled, CATALOG).content_hash != base.content_hash
    touched = copy.deepcopy(raw)
    touched["modified"] = "2018-07-11"
    assert normalize(touched, CATALOG).metadata_hash == base.metadata_hash
    refreshed = copy.deepcopy(raw)
    refreshed["distribution"][0]["modified"] = "2018-07-11T00:00:00"  # the file's own date
    assert normalize(refreshed, CATALOG).metadata_hash != base.metadata_hash
    described = copy.deepcopy(raw)
    described["distribution"][2]["field"][1]["description"] += " (corregido)"  # a column's description
    assert normalize(described, CATALOG).metadata_hash != base.metadata_hash
    moved_mail = copy.deepcopy(raw)
    moved_mail["publisher"]["mbox"] = "otra@mecon.gov.ar"
    assert normalize(moved_mail, CATALOG).metadata_hash != base.metadata_hash


def test_a_dcat_us_entry_maps_publisher_chain_access_urls_and_odd_dates():
    raw = entry(US / "dcatus.json", "cftc-dc1")
    record = normalize(raw, CATALOG)
    assert record.organization == "U.S. Commodity Futures Trading Commission"
    assert record.raw["organization"]["name"] == "u-s-commodity-futures-trading-commission"
    assert record.raw["resources"] == [{"url": raw["distribution"][0]["accessURL"], "format": "", "name": ""}]
    assert record.raw["metadata_modified"] == "R/P1W" and record.metadata_modified is None
    assert record.url == f"{CATALOG}#cftc-dc1"  # no landing page
    extras = {e["key"]: e["value"] for e in record.raw["extras"]}
    assert set(extras) == {"contactPoint", "describedBy", "programCode", "accessLevel", "bureauCode", "isPartOf",
                           "spatial", "publisher.subOrganizationOf"}
    assert json.loads(extras["publisher.subOrganizationOf"]) == {"name": "U.S. Government"}
    dated = normalize(entry(US / "dcatus.json", "cftc-dc5"), CATALOG)
    assert dated.metadata_modified == datetime(2011, 6, 30, tzinfo=timezone.utc)
    typed = normalize(entry(US / "ckanext-datajson" / "missing-identifier-title.data.json", "Test-0001"), CATALOG)
    assert typed.raw["resources"][0]["format"] == "application/vnd.ms-excel"  # the media type stands in


def test_keywords_given_as_one_string():
    raw = entry(US / "dcatus.json", "cftc-dc2")
    raw["keyword"] = "banking, bpr ,, banking"
    assert normalize(raw, CATALOG).tags == ["banking", "bpr"]


def test_identifiers_missing_odd_or_derived_from_the_landing_page():
    raw = entry(US / "ckanext-datajson" / "ny.data.json", load_json(
        US / "ckanext-datajson" / "ny.data.json")["dataset"][0]["identifier"])
    landing = raw["landingPage"]
    del raw["identifier"]
    derived = normalize(raw, CATALOG)
    assert derived.ok and derived.source_id == "landing:" + sha256_hex(normalize_url(landing))[:32]
    assert normalize({**raw, "identifier": "   "}, CATALOG).source_id == derived.source_id
    assert normalize({**raw, "identifier": "  ny-1 "}, CATALOG).source_id == "ny-1"
    assert normalize({**raw, "identifier": {"@id": "https://x.example/1"}}, CATALOG).source_id == "https://x.example/1"
    listed = normalize({**raw, "identifier": ["a", "b"]}, CATALOG)
    assert not listed.ok and "identifier is a list" in listed.error and raw["title"] in listed.error


@pytest.mark.parametrize("field,value,words", [
    ("title", ["a", "b"], ["title is a list", "'cftc-dc3'"]),
    ("distribution", {"downloadURL": "http://x.example/a.csv"}, ["distribution is an object"]),
    ("distribution", ["http://x.example/a.csv"], ["distribution[0] is a string"]),
    ("keyword", {"k": 1}, ["keyword is an object"]),
    ("keyword", ["ok", None], ["keyword[1] is null"]),
    ("theme", 3, ["theme is a number"]),
    ("publisher", ["Agency"], ["publisher is a list"]),
    ("description", {"en": "text"}, ["description is an object"]),
    ("license", "<p>Terms of use</p>", ["license", "HTML"]),
])
def test_entries_of_the_wrong_shape_fail_naming_field_and_dataset(field, value, words):
    raw = entry(US / "dcatus.json", "cftc-dc3")
    record = normalize({**raw, field: value}, CATALOG)
    assert not record.ok and record.source_id == "cftc-dc3"
    for word in words if field == "title" else [*words, "'Cotton On Call'"]:
        assert word in record.error


def test_a_record_that_is_not_an_object_fails():
    records = list(iter_records(io.BytesIO(b'{"dataset": ["just a string", 4]}'), CATALOG))
    assert [r.ok for r in records] == [False, False]
    assert "entry 1" in records[0].error and "not a JSON object" in records[0].error


def test_a_second_entry_with_the_same_identifier_fails():
    catalogue = load_json(US / "dcatus.json")
    first = copy.deepcopy(catalogue["dataset"][0])
    first["title"] = "Commitment of Traders (again)"
    catalogue["dataset"].append(first)
    records = list(iter_records(io.BytesIO(json.dumps(catalogue).encode()), CATALOG))
    assert [r.ok for r in records] == [True] * 7 + [False]
    assert records[-1].error == ("entry 8: dataset 'Commitment of Traders (again)': duplicate identifier "
                                 "'cftc-dc1' (first seen as entry 1)")
    assert records[-1].source_id == "cftc-dc1"


# -- the document ------------------------------------------------------------------------------------
@pytest.mark.parametrize("body,words", [
    (b"<!DOCTYPE html><html><body>Maintenance</body></html>", ["not a valid JSON"]),
    (b'{"title": "a catalogue without datasets", "distribution": []}', ["no 'dataset' array"]),
    (b'{"dataset": {"title": "not a list"}}', ["no 'dataset' array"]),
    (b'"data.json"', ["single JSON value"]),
    (b"", ["empty"]),
])
def test_a_document_that_is_not_a_catalogue_raises_naming_the_url(body, words):
    with pytest.raises(InvalidCatalogue) as err:
        list(iter_records(io.BytesIO(body), "https://user:secret@portal.example.org/data.json"))
    assert isinstance(err.value, ValueError)
    assert "https://***@portal.example.org/data.json" in str(err.value) and "secret" not in str(err.value)
    for word in words:
        assert word in str(err.value)


def test_a_catalogue_cut_short_raises_after_what_it_held():
    with gzip.open(sample(AR / "data.json-2018-07-10.json.gz"), "rb") as handle:
        body = handle.read()
    seen = []
    with pytest.raises(InvalidCatalogue, match="not a valid JSON"):
        for record in iter_records(io.BytesIO(body[:len(body) // 2]), CATALOG):
            seen.append(record)
    assert 100 < len(seen) < 639


def test_empty_catalogues_bare_lists_and_byte_order_marks():
    assert list(iter_entries(io.BytesIO(b'{"dataset": []}'))) == []
    single = load_json(US / "dcatus_single_record.json")
    bare = json.dumps(single["dataset"]).encode()  # Project Open Data 1.0: a top-level array
    assert [r.source_id for r in iter_records(io.BytesIO(bare), CATALOG)] == ["cftc-dc1"]
    marked = b"\xef\xbb\xbf" + json.dumps(single).encode()
    assert [r.source_id for r in iter_records(io.BytesIO(marked), CATALOG)] == ["cftc-dc1"]


def test_entries_are_built_as_json_load_builds_them():
    body = (b'{"dataset": [{"a": [[1, {"b": []}], {}, [[]]], "c": null, "d": {"e": {"f": [true, false, -2e3]}}},'
            b' [], {}], "x": {"dataset": [{"not": "a catalogue\'s own"}]}}')
    assert list(iter_entries(io.BytesIO(body))) == json.loads(body)["dataset"]
    real = (US / "dcatus_with_none.json").read_bytes()
    assert list(iter_entries(io.BytesIO(real))) == json.loads(real)["dataset"]


def test_numbers_are_floats_not_decimals():
    body = b'{"dataset": [{"identifier": "n", "title": "t", "size": 1.5, "count": 3}]}'
    assert next(iter_entries(io.BytesIO(body))) == {"identifier": "n", "title": "t", "size": 1.5, "count": 3}
    record = next(iter_records(io.BytesIO(body), CATALOG))
    assert {"key": "size", "value": "1.5"} in record.raw["extras"]


def write_catalogue(path: Path, n: int) -> None:
    """A catalogue of ``n`` entries derived from a real one, written entry by entry."""
    base = load_json(US / "dcatus.json")["dataset"]
    with path.open("w", encoding="utf-8") as out:
        out.write('{"@type": "dcat:Catalog", "dataset": [\n')
        for i in range(n):
            item = dict(base[i % len(base)], identifier=f"gen-{i:06d}", title=f"{base[i % len(base)]['title']} {i}")
            out.write(("," if i else "") + json.dumps(item) + "\n")
        out.write('], "title": "generated"}\n')


def test_a_large_catalogue_streams_in_little_memory(tmp_path):
    path = tmp_path / "data.json"
    write_catalogue(path, 20000)
    size = path.stat().st_size
    assert size > 15_000_000
    tracemalloc.start()
    try:
        with path.open("rb") as handle:
            count = sum(1 for _ in iter_entries(handle))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert count == 20000
    assert peak < size / 10, f"peak {peak} bytes while parsing {size} bytes: the document was held in memory"
    with path.open("rb") as handle:
        records = list(iter_records(handle, CATALOG))
    assert len(records) == 20000 and all(r.ok for r in records)
    assert len({r.source_id for r in records}) == 20000


# -- over HTTP -----------------------------------------------------------------------------------------
ETAG = '"catalogue-v1"'
LAST_MODIFIED = "Tue, 10 Jul 2018 12:00:00 GMT"


class CatalogueServer:
    """A real HTTP server on 127.0.0.1 serving one catalogue: as is with validators (answering 304
    to them), gzip-encoded, as a .gz file, cut short, and some errors."""

    def __init__(self, body: bytes):
        self.body, self.gzipped = body, gzip.compress(body)
        self.requests: list[tuple[str, dict]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):
                headers = {k.lower(): v for k, v in self.headers.items()}
                server.requests.append((self.path, headers))
                status, extra, data = server.answer(self.path, headers)
                self.send_response(status)
                for name, value in extra.items():
                    self.send_header(name, value)
                if "Content-Length" not in extra:
                    self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                if self.path == "/cut.json":
                    self.close_connection = True

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def answer(self, path: str, headers: dict):
        validators = {"ETag": ETAG, "Last-Modified": LAST_MODIFIED, "Content-Type": "application/json"}
        if path == "/data.json":
            if headers.get("if-none-match") == ETAG or headers.get("if-modified-since") == LAST_MODIFIED:
                return 304, {"ETag": ETAG}, b""
            return 200, validators, self.body
        if path == "/gzip-encoded.json":
            assert "gzip" in headers.get("accept-encoding", "")
            return 200, {**validators, "Content-Encoding": "gzip"}, self.gzipped
        if path == "/deflate-encoded.json":
            return 200, {"Content-Encoding": "deflate"}, zlib.compress(self.body)
        if path == "/data.json.gz":
            return 200, {"Content-Type": "application/gzip"}, self.gzipped
        if path == "/cut.json":
            return 200, {"Content-Length": str(len(self.body))}, self.body[:len(self.body) // 2]
        if path == "/maintenance.html":
            return 200, {"Content-Type": "text/html"}, b"<html><body>Back soon</body></html>"
        if path == "/down.json":
            return 503, {}, b"unavailable"
        return 404, {}, b"not found"

    def __enter__(self):
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(scope="module")
def ar_body() -> bytes:
    with gzip.open(sample(AR / "data.json-2018-07-10.json.gz"), "rb") as handle:
        return handle.read()


@pytest.fixture
def server(ar_body):
    with CatalogueServer(ar_body) as srv:
        yield srv


def source(url: str, **settings) -> DcatJsonSource:
    return DcatJsonSource(url, fetcher=HttpFetcher(url, **{"max_retries": 1, "backoff": 0, **settings}),
                          page_size=250)


def test_a_catalogue_over_http_then_not_modified(server):
    first = source(server.url + "/data.json")
    pages = list(first.iter_pages(None))
    assert [len(p) for p in pages] == [250, 250, 139]
    assert sum(r.ok for p in pages for r in p) == 639 and first.listed == 639 and first.total == 639
    assert first.validators == {"etag": ETAG, "last_modified": LAST_MODIFIED}
    assert not first.not_modified
    assert first.requests_made == 1 and first.bytes_received == len(server.body)

    again = source(server.url + "/data.json")
    assert list(again.iter_pages(first.validators)) == []
    assert again.not_modified and again.requests_made == 1 and again.listed == 0
    assert again.validators["etag"] == ETAG
    assert server.requests[-1][1]["if-none-match"] == ETAG
    assert server.requests[-1][1]["if-modified-since"] == LAST_MODIFIED

    forced = source(server.url + "/data.json")
    assert sum(len(p) for p in forced.iter_pages(first.validators, conditional=False)) == 639
    assert "if-none-match" not in server.requests[-1][1]


def test_compressed_answers_stream_and_count_compressed_bytes(server):
    encoded = source(server.url + "/gzip-encoded.json")
    assert sum(len(p) for p in encoded.iter_pages(None)) == 639
    assert encoded.bytes_received == len(server.gzipped) < len(server.body) / 5
    deflated = source(server.url + "/deflate-encoded.json")
    assert sum(len(p) for p in deflated.iter_pages(None)) == 639
    as_file = source(server.url + "/data.json.gz")
    assert sum(len(p) for p in as_file.iter_pages(None)) == 639


def test_the_source_protocol_fills_the_listing(server):
    src = source(server.url + "/data.json")
    listing = Listing()
    assert sum(len(p) for p in src.iter_records(None, 500, listing)) == 639
    assert listing.complete and not listing.not_modified and listing.validators["etag"] == ETAG
    unchanged = Listing()
    assert list(source(server.url + "/data.json").iter_records(None, 500, unchanged, listing.validators)) == []
    assert unchanged.not_modified and not unchanged.complete


def test_http_failures(server):
    with pytest.raises(SourceError, match="HTTP 404") as err:
        list(source(server.url + "/missing.json").iter_pages(None))
    assert not err.value.transient
    with pytest.raises(SourceUnavailable):
        list(source(server.url + "/down.json").iter_pages(None))
    with pytest.raises(InvalidCatalogue, match="maintenance.html"):
        list(source(server.url + "/maintenance.html").iter_pages(None))
    cut = source(server.url + "/cut.json")
    with pytest.raises(SourceUnavailable, match="broke off") as err:
        list(cut.iter_pages(None))
    assert err.value.transient and cut.validators == {} and cut.total is None
    assert 0 < cut.bytes_received <= len(server.body) // 2


def test_landing_ids_are_the_sha256_of_the_normalized_landing_page():
    url = "HTTP://Data.Example.org/Dataset/1/"
    expected = "landing:" + hashlib.sha256(b"http://data.example.org/Dataset/1").hexdigest()[:32]
    assert normalize({"title": "t", "landingPage": url}, CATALOG).source_id == expected


# -- what Python's json writes but ijson refuses or alters (issue 36) --------------------------------
def _written_by_python(entries: list) -> bytes:
    """A catalogue as a portal's Python writer serves it: ``json.dumps`` writes a float NaN or
    infinity as a bare NaN, Infinity or -Infinity, and a lone surrogate as its escape."""
    return json.dumps({"conformsTo": "https://project-open-data.cio.gov/v1.1/schema", "dataset": entries},
                      indent=1).encode()


def _bad_values_catalogue() -> list:
    real = entry(US / "dcatus_single_record.json", "cftc-dc1")
    numbers = dict(copy.deepcopy(real), identifier="numbers", size=float("nan"),
                   spatial={"bbox": [-float("inf"), 1.5]})
    numbers["distribution"][0]["byteSize"] = float("inf")
    words = dict(copy.deepcopy(real), identifier="words", title='The "NaN" report',
                 description='values NaN, Infinity and -Infinity; quoted: \\"NaN\\"', keyword=["NaN", "Infinity"])
    ident = dict(copy.deepcopy(real), identifier="cftc-\ud800", title="An identifier with a lone surrogate")
    low = dict(copy.deepcopy(real), identifier="low", title="A lone low half \udc00 in a title")
    return [real, numbers, words, ident, low]


def test_bare_nan_and_infinity_and_lone_surrogates_over_http_are_their_records_outcomes():
    """Before, the bare NaN failed the whole document ("not a valid JSON document"), the lone low
    half did (a UnicodeDecodeError), and the lone high half in an identifier became '?'."""
    entries = _bad_values_catalogue()
    body = _written_by_python(entries)
    assert b'"size": NaN' in body and b"Infinity" in body and b'"cftc-\\ud800"' in body
    with DcatServer() as server:
        server.set_document("/data.json", body)
        src = source(server.url("/data.json"))
        records = [r for page in src.iter_pages(None) for r in page]
    assert src.listed == 5 and [r.source_id for r in records] == ["cftc-dc1", "numbers", "words", "cftc-\\ud800", "low"]
    real, numbers, words, ident, low = records
    assert real.ok and not [p for p in real.problems if p.stage == "parse"]

    assert numbers.ok
    (found,) = [p for p in numbers.problems if p.code == "non-finite-number"]
    assert (found.field, found.value, found.severity) == ("distribution[0].byteSize", "Infinity", "warning")
    assert found.message == ("record 'numbers': a non-finite number (Infinity) was made null at "
                             "distribution[0].byteSize (3 values in all)")  # the first in the entry, then size, bbox
    extras = {e["key"]: e["value"] for e in numbers.raw["extras"]}
    assert extras["size"] == "null" and extras["spatial"] == '{"bbox":[null,1.5]}'
    assert extras["distribution[0].byteSize"] == "null"
    same_but_numbers = normalize({k: v for k, v in entries[1].items() if k not in ("size", "spatial")}, CATALOG)
    assert numbers.content_hash == same_but_numbers.content_hash  # the text is the entry's own

    assert words.ok and words.title == 'The "NaN" report' and not [p for p in words.problems if p.stage == "parse"]
    assert words.description == 'values NaN, Infinity and -Infinity; quoted: \\"NaN\\"'
    assert {"key": "keyword", "value": "NaN"} not in words.raw["extras"] and words.tags == ["Infinity", "NaN"]

    assert not ident.ok and [p.code for p in ident.problems if p.severity == "error"] == ["unstorable-identifier"]
    assert "record 'cftc-\\ud800': its identifier holds a lone surrogate" in ident.error

    assert low.ok and low.title == "A lone low half \ufffd in a title"
    assert [(p.code, p.field) for p in low.problems if p.stage == "parse"] == [("lone-surrogate", "title")]


def test_without_bare_tokens_a_catalogue_reads_as_it_did(ar_body):
    """The filter passes a real catalogue's bytes on as they are (the entries json.load gives)."""
    assert list(iter_entries(io.BytesIO(ar_body))) == json.loads(ar_body)["dataset"]


def test_a_large_catalogue_with_nan_in_every_entry_streams_in_little_memory(tmp_path):
    path = tmp_path / "data.json"
    base = load_json(US / "dcatus.json")["dataset"]
    with path.open("w", encoding="utf-8") as out:
        out.write('{"dataset": [\n')
        for i in range(12000):
            item = dict(base[i % len(base)], identifier=f"gen-{i:06d}", size=float("nan"))
            out.write(("," if i else "") + json.dumps(item) + "\n")
        out.write("]}\n")
    size = path.stat().st_size
    tracemalloc.start()
    try:
        with path.open("rb") as handle:
            count = sum(1 for e in iter_entries(handle) if e["size"] != e["size"])  # NaN, as json.load reads it
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert count == 12000
    assert peak < size / 10, f"peak {peak} bytes while parsing {size} bytes: the document was held in memory"


# -- nesting of any depth (issue 36) ----------------------------------------------------------------
def test_entries_nested_too_deep_are_their_own_errors_over_http_at_any_depth():
    """An entry 65 levels deep was stored (its extras written as texts, in which screening saw no
    depth), one of 1,500 failed the whole document (RecursionError in the mapping's json.dumps),
    and one of 100,000 ran out of memory in the parser (ijson's paths, one string per event,
    grow with the depth: 2.2 GB at 30,000 levels). Nesting outside any dataset, as deep, is read
    through. Each deep entry is now its own record-too-deep, named where it passes 64 levels, and
    the others are read as before (a NaN deep inside one does not make a later one's be missed)."""
    real = entry(US / "dcatus_single_record.json", "cftc-dc1")
    entries = [real]
    for name, levels, leaf in (("deep-65", 64, '"bottom"'), ("deep-1500", 1500, '"bottom"'),
                               ("deep-100000", 100_000, "NaN")):
        entries.append(dict(copy.deepcopy(real), identifier=name, title=f"Nested {levels}", tree=nested(levels, leaf)))
    entries.append(dict(copy.deepcopy(real), identifier="after", size=float("nan")))
    body = dumps({"conformsTo": "https://project-open-data.cio.gov/v1.1/schema", "junk": nested(100_000),
                  "dataset": entries}).encode()
    assert 1_000_000 < len(body) < 2_000_000
    with DcatServer() as server:
        server.set_document("/data.json", body)
        src = source(server.url("/data.json"))
        tracemalloc.start()
        try:
            records = [r for page in src.iter_pages(None) for r in page]
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert peak < 30_000_000, f"peak {peak} bytes reading a {len(body)}-byte catalogue"
    assert src.listed == 5 and [r.source_id for r in records] == ["cftc-dc1", "deep-65", "deep-1500", "deep-100000",
                                                                   "after"]
    first, *deep, after = records
    assert first.ok and after.ok
    assert [(p.code, p.field) for p in after.problems if p.stage == "parse"] == [("non-finite-number", "size")]
    for n, record in enumerate(deep, 2):
        assert not record.ok and [(p.code, p.field) for p in record.problems] == [
            ("record-too-deep", "tree" + ".in" * (64 - 1))]  # the entry is the first level, tree the second
        assert record.error == (f"entry {n}: record {record.source_id!r} nests objects and arrays more than 64 levels "
                                f"deep (at tree{'.in' * 63}): it is not stored")
        assert record.raw == {"id": record.source_id}
