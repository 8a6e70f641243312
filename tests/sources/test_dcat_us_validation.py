"""DCAT-US schema validation of data.json entries (harvester.sources.dcat_json) and the coded
problems of every failed entry, on the real catalogues in ../shared/dcat-samples.

The expected verdicts are computed apart from the module (harvester.testing.expected_outcomes):
the vendored JSON Schemas are loaded and run with jsonschema directly, the catalogue's entries are
found by walking the document json.load gives, and the module's own rules (identifier, title, field
types, licence, duplicates) are restated from its documentation. Only then are they compared with
what ``iter_records`` yields.
"""
from __future__ import annotations

import copy
import gzip
import hashlib
import io
import json
import logging
import re
from collections import Counter
from pathlib import Path

import pytest

from harvester.domain.outcomes import CODES, ERROR, WARNING
from harvester.sources.dcat_json import (DCAT_US_1_1, DCAT_US_3_0, MAX_SCHEMA_PROBLEMS, DcatJsonSource, conformance,
                                         iter_records)
from harvester.testing.samples import dcat_samples_dir, existing, load_json
from harvester.testing.expected_outcomes import (POD_1_1, SCHEMAS, expected_outcomes, path_text, schema_fields,
                                                 validator_1_1, validator_3_0)

DCAT = dcat_samples_dir()
US = DCAT / "dcat-us"
AR = DCAT / "datos-gob-ar"
CATALOG = "https://catalog.example.org/data.json"
sample = existing


def records_of(document) -> list:
    body = document if isinstance(document, bytes) else json.dumps(document).encode()
    return list(iter_records(io.BytesIO(body), CATALOG))


def outcomes(records) -> list[Counter]:
    return [Counter(p.code for p in r.problems if p.severity == ERROR) for r in records]


# -- the vendored files ---------------------------------------------------------------------------
def test_the_vendored_schemas_are_the_upstream_files_unchanged():
    """Every file the README lists is here with the git blob hash it names (the hash git gives the
    file at the named commit of GSA/datagov-harvester), and nothing else is vendored."""
    readme = (SCHEMAS / "README.md").read_text()
    commit = re.search(r"commit: `([0-9a-f]{40})`", readme).group(1)
    rows = re.findall(r"^\| (dcat_us_\S+) \| (schemas/\S+) \| `([0-9a-f]{12})` \|$", readme, re.M)
    assert commit and len(rows) == 3 + 26
    for local, upstream, blob in rows:
        data = (SCHEMAS / local).read_bytes()
        assert hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()[:12] == blob, local
        assert Path(local).name == Path(upstream).name
    assert {str(p.relative_to(SCHEMAS)) for p in SCHEMAS.rglob("*.json")} == {local for local, _, _ in rows}
    ids = {json.loads(p.read_text())["$id"] for p in (SCHEMAS / "dcat_us_3_0").glob("*.json")}
    assert "https://resources.data.gov/dcat-us/3.0.0/definitions/dataset" in ids and len(ids) == 26


def test_the_schemas_are_never_fetched(monkeypatch):
    """A 3.0 entry is checked through $refs to other definitions (dataset -> kind, organization)
    with every connection refused: the vendored files are all it reads."""
    import socket

    def refuse(*args, **kwargs):
        raise AssertionError("a connection was attempted")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    entry = {"@type": "Dataset", "title": "t", "description": "d", "identifier": "x",
             "contactPoint": {"@type": "Kind", "fn": 5}, "publisher": {"@type": "Organization", "name": 7}}
    document = {"conformsTo": {"@type": "Standard", "title": "DCAT-US 3.0"}, "dataset": [entry]}
    assert {path_text(p) for p in schema_fields(validator_3_0(), entry)} == {"contactPoint", "publisher"}
    record, = records_of(document)
    assert [(p.code, p.field) for p in record.problems] == [("wrong-type", "publisher.name"),
                                                            ("schema-violation", "contactPoint.fn")]
    assert record.problems[1].message == "contactPoint.fn: 5 is not of type 'string'"


# -- every sample --------------------------------------------------------------------------------
US_SAMPLES = sorted(str(p.relative_to(US)) for p in US.rglob("*.json")) if US.exists() else []


def test_the_dcat_us_samples_are_there():
    assert len(US_SAMPLES) >= 39 and "dcatus3_0_invalid.json" in US_SAMPLES


@pytest.mark.parametrize("name", US_SAMPLES)
def test_every_dcat_us_sample_fails_exactly_the_entries_its_schema_and_the_rules_fail(name):
    document = load_json(US / name)
    expected = expected_outcomes(document)
    records = records_of((US / name).read_bytes())
    assert outcomes(records) == expected
    for record in records:
        assert record.ok == (not any(p.severity == ERROR for p in record.problems))
        if not record.ok:
            assert record.error.startswith("entry ") and all(p.message in record.error for p in record.problems)
        for p in record.problems:
            assert p.code in CODES and p.message
            if p.code == "schema-violation" and p.field:
                assert p.message.startswith(p.field + ": ")


def test_the_samples_cover_both_versions_and_both_verdicts():
    """The comparison above is worth something only if the samples fail some entries by schema."""
    failing = {name: sum(c["schema-violation"] > 0 for c in expected_outcomes(load_json(US / name)))
               for name in US_SAMPLES}
    assert failing["dcatus3_0_invalid.json"] == 1
    assert failing["dcatus_with_none.json"] == 391
    assert failing["dcatus_long_description.json"] == 1
    assert failing["ckanext-datajson/missing-catalog.data.json"] == 0  # no conformsTo: no schema
    assert sum(1 for n in US_SAMPLES if conformance(load_json(US / n).get("conformsTo")) == DCAT_US_3_0) >= 10


def test_a_dcat_us_3_0_record_without_a_contact_point_fails_and_the_valid_one_is_stored():
    records = records_of((US / "dcatus3_0_invalid.json").read_bytes())
    assert [r.ok for r in records] == [False, True]
    bad = records[0]
    assert bad.source_id == "https://example.gov/datasets/invalid"
    assert [(p.code, p.field) for p in bad.problems] == [("schema-violation", "contactPoint")]
    assert bad.error == ("entry 1: dataset 'Invalid Dataset (missing contactPoint)': contactPoint: required property "
                         "is missing")
    assert schema_fields(validator_3_0(), load_json(US / "dcatus3_0_invalid.json")["dataset"][0]) == {("contactPoint",)}


def test_a_1_1_record_missing_required_fields_names_each_and_the_bad_values():
    document = load_json(US / "dcatus.json")
    entry = document["dataset"][0]
    for key in ("keyword", "accessLevel", "contactPoint"):
        del entry[key]
    entry["distribution"][0]["mediaType"] = "csv"
    entry["modified"] = "last tuesday"
    document["dataset"] = [entry]
    record, = records_of(document)
    assert not record.ok and record.source_id == "cftc-dc1"
    expected = sorted(path_text(p) for p in schema_fields(validator_1_1(), entry))
    assert expected == ["accessLevel", "contactPoint", "distribution", "keyword", "modified"]
    problems = {p.field: p for p in record.problems}
    assert sorted(problems) == ["accessLevel", "contactPoint", "distribution[0].mediaType", "keyword", "modified"]
    assert all(p.code == "schema-violation" for p in record.problems)
    media = problems["distribution[0].mediaType"]
    assert media.value == "csv" and media.message == ("distribution[0].mediaType: 'csv' is not a media type "
                                                      "(e.g. text/csv or application/json)")
    assert problems["modified"].value == "last tuesday" and "'last tuesday'" in problems["modified"].message
    assert problems["keyword"].message == "keyword: required property is missing" and problems["keyword"].value is None
    assert record.error.startswith("entry 1: dataset 'Commitment of Traders': accessLevel: required property")
    assert [p.field for p in record.problems] == sorted(problems, key=lambda f: f.replace("[", "."))


def test_many_violations_are_cut_to_the_first_few_and_a_count():
    document = {"conformsTo": POD_1_1, "dataset": [{"identifier": "x", "title": "t", "accrualPeriodicity": "often",
                                                   "conformsTo": 3, "dataQuality": "yes", "language": 5,
                                                   "primaryITInvestmentUII": "?", "systemOfRecords": 4}]}
    entry = document["dataset"][0]
    fields = schema_fields(validator_1_1(), entry)
    assert len(fields) > MAX_SCHEMA_PROBLEMS
    record, = records_of(document)
    assert len(record.problems) == MAX_SCHEMA_PROBLEMS
    assert record.problems[-1].message == f"and {len(fields) - MAX_SCHEMA_PROBLEMS + 1} more schema violations"


def test_the_federal_profile_requires_bureau_and_program_codes():
    path = US / "dcatus_single_record_non-federal.json"
    document = load_json(path)
    assert expected_outcomes(document) == [Counter()]
    federal = expected_outcomes(document, "federal")
    assert federal[0]["schema-violation"] >= 1
    body = path.read_bytes()
    assert outcomes(iter_records(io.BytesIO(body), CATALOG, schema_profile="federal")) == federal
    fields = {p.field for r in iter_records(io.BytesIO(body), CATALOG, schema_profile="federal") for p in r.problems
              if p.code == "schema-violation"}
    assert {"bureauCode", "programCode"} <= fields
    with pytest.raises(ValueError, match="schema profile 'state'"):
        DcatJsonSource(CATALOG, fetcher=None, schema_profile="state")


# -- which schema --------------------------------------------------------------------------------
@pytest.mark.parametrize("conforms_to,version", [
    (POD_1_1, DCAT_US_1_1),
    ("http://project-open-data.cio.gov/v1.1/schema/", DCAT_US_1_1),
    ({"@type": "Standard", "title": "DCAT-US 3.0"}, DCAT_US_3_0),
    ({"@type": "Standard", "@id": "https://resources.data.gov/dcat-us/3.0.0/"}, DCAT_US_3_0),
    ("https://resources.data.gov/dcat-us/3.0", DCAT_US_3_0),
    ("https://project-open-data.cio.gov/v1.0/schema", None),
    ("http://datos.gob.ar/superThemeTaxonomy.json", None),
    ({"@type": "Standard", "title": "DCAT-AP 2.1"}, None),
    (None, None),
])
def test_the_catalogues_conforms_to_names_the_schema(conforms_to, version):
    assert conformance(conforms_to) == version


@pytest.mark.parametrize("name", sorted(p.name for p in AR.glob("*.json.gz")) if AR.exists() else [])
def test_a_datos_gob_ar_catalogue_is_not_held_to_dcat_us(name):
    document = load_json(AR / name)
    assert document.get("conformsTo") is None
    with gzip.open(sample(AR / name), "rb") as handle:
        records = list(iter_records(handle, "http://datos.gob.ar/data.json"))
    assert len(records) == len(document["dataset"])
    assert not any(p.code == "schema-violation" for r in records for p in r.problems)
    assert all(r.ok for r in records)


def test_the_same_entries_under_a_dcat_us_conforms_to_are_held_to_it():
    """The snapshot above passes because it names no DCAT-US schema, not because it would pass one."""
    document = load_json(AR / "data.json-2018-04-16.json.gz")
    document = {"conformsTo": POD_1_1, **document}
    expected = expected_outcomes(document)
    assert sum(c["schema-violation"] > 0 for c in expected) > 100
    assert outcomes(records_of(document)) == expected


def test_a_conforms_to_after_the_datasets_leaves_the_entries_before_it_unchecked(caplog):
    document = load_json(US / "dcatus3_0_invalid.json")
    late = {"dataset": document["dataset"], "conformsTo": document["conformsTo"]}
    caplog.set_level(logging.WARNING, logger="harvester")
    records = records_of(late)
    assert [r.ok for r in records] == [True, True]
    assert any("conformsTo comes after 2 dataset entries" in r.getMessage() for r in caplog.records)
    assert [r.ok for r in records_of(document)] == [False, True]


# -- the module's own checks, coded --------------------------------------------------------------
def cftc(**changes):
    entry = copy.deepcopy(load_json(US / "dcatus.json")["dataset"][2])
    entry.update(changes)
    return entry


@pytest.mark.parametrize("entry,code,field,value", [
    (cftc(title=["a", "b"]), "wrong-type", "title", "['a', 'b']"),
    (cftc(distribution=[{"downloadURL": 7, "mediaType": "text/csv"}]), "wrong-type", "distribution[0].downloadURL",
     "7"),
    (cftc(keyword=["ok", None]), "wrong-type", "keyword[1]", None),
    (cftc(license="<p>Terms of use</p>"), "bad-license", "license", "<p>Terms of use</p>"),
    (cftc(license="x" * 600), "bad-license", "license", "x" * 199 + "…"),
    (cftc(title=None), "no-title", "title", None),
    (cftc(identifier=None, landingPage=None), "no-identifier", "identifier", None),
    (cftc(identifier={"@type": "Identifier"}), "no-identifier", "identifier", "{'@type': 'Identifier'}"),
    (cftc(identifier=["a"]), "wrong-type", "identifier", "['a']"),
])
def test_the_modules_own_checks_are_coded_with_field_and_value(entry, code, field, value):
    """Without a schema (no conformsTo): the module's checks alone, each its code, field and value."""
    record, = records_of({"dataset": [entry]})
    assert not record.ok
    assert [(p.code, p.field, p.value) for p in record.problems] == [(code, field, value)]
    assert record.error.startswith("entry 1: ") and record.problems[0].message in record.error


def test_a_field_the_module_found_wrong_is_not_reported_again_by_the_schema():
    entry = cftc(title=707)
    assert ("title",) in schema_fields(validator_1_1(), entry)
    record, = records_of({"conformsTo": POD_1_1, "dataset": [entry]})
    assert [(p.code, p.field) for p in record.problems] == [("wrong-type", "title")]
    assert record.error == "entry 1: dataset with identifier 'cftc-dc3': title is a number, not a string"


def test_duplicates_and_entries_that_are_not_objects_are_coded():
    document = load_json(US / "dcatus.json")
    document["dataset"] += [copy.deepcopy(document["dataset"][0]), "just a string"]
    records = records_of(document)
    assert [r.ok for r in records] == [True] * 7 + [False, False]
    dup, text = records[7], records[8]
    assert [(p.code, p.field, p.value) for p in dup.problems] == [("duplicate-identifier", "identifier", "cftc-dc1")]
    assert dup.error == ("entry 8: dataset 'Commitment of Traders': duplicate identifier 'cftc-dc1' "
                         "(first seen as entry 1)")
    assert [p.code for p in text.problems] == ["not-an-object"]
    assert text.error == "entry 9: entry is a string, not a JSON object"


# -- warnings ------------------------------------------------------------------------------------
def test_warnings_never_make_a_record_fail():
    """A schema-valid 1.1 entry modified in the future with an ftp landing page, and a datos.gob.ar
    entry (no schema) without description, licence or distribution: stored, with their warnings."""
    future = cftc(modified="2999-01-01", landingPage="ftp://ftp.example.org/cot")
    assert schema_fields(validator_1_1(), future) == set()
    bare = {k: v for k, v in load_json(AR / "data.json-2018-04-16.json.gz")["dataset"][0].items()
            if k not in ("description", "license", "distribution")}
    us, = records_of({"conformsTo": POD_1_1, "dataset": [future]})
    ar, = records_of({"dataset": [bare]})
    assert us.ok and ar.ok
    assert {p.code for p in us.problems} >= {"modified-in-future", "landing-page-not-http"}
    assert {p.code for p in ar.problems} >= {"no-description", "no-license", "no-distribution"}
    assert all(p.severity == WARNING for p in us.problems + ar.problems)
