"""Per-record outcomes (record_outcomes, sql/017) through real Airflow (dag.test()), real HTTP to a
local catalogue or CKAN portal and a real PostgreSQL: every broken sample of ../shared/dcat-samples
and the broken records of the CKAN samples leave the error rows an independent reading of the files
says they must (harvester.testing.expected_outcomes: jsonschema on the vendored schemas, rdflib
triple lookups; for CKAN, the three rules restated here), a catalogue whose records all fail fails
its run with its rows kept, a document that is not a catalogue fails its run, a record with only
warnings is stored, and a second run of the same catalogue does not write the first run's rows
again.

Each sample is harvested once (one dag.test() run costs a few seconds)."""
from __future__ import annotations

import copy
import json
import logging
import re
from collections import Counter
from datetime import datetime

import pytest
from rdflib import Graph
from rdflib.namespace import DCAT, RDF

from harvester.testing.expected_outcomes import (RULE_CODES, expected_dataset, expected_outcomes, identifier_of,
                                                 listed_entries)
from harvester.testing.samples import dcat_samples_dir, load_samples, sample_path

DCAT_SAMPLES = dcat_samples_dir()
US = DCAT_SAMPLES / "dcat-us"
AP = DCAT_SAMPLES / "dcat-ap"
# The sample the second-run test harvests (twice, changed in between): it is left out of the
# one-run list below so that no sample is harvested more than its test needs.
TWICE = "dcatus3_0.json"
# Every DCAT-US sample with at least one record that fails (test_the_lists_name_every_broken_sample
# checks this list against the files).
BROKEN_US = [
    "ckanext-datajson/missing-catalog.data.json", "ckanext-datajson/missing-dataset-fields.data.json",
    "ckanext-datajson/missing-identifier-title.data.json", "ckanext-datajson/numerical-title.data.json",
    "dcatus3_0_invalid.json", "dcatus3_0_no_identifier.json", "dcatus_bad_license_uri.json",
    "dcatus_long_description.json", "dcatus_multiple_invalid.json", "dcatus_no_identifier.json",
    "dcatus_with_none.json", "missing_title.json",
]
# The DCAT-AP samples that parse and have a dataset that fails, and geonetwork.xml, whose four
# distributions lack dcat:accessURL: DCAT-AP makes that property mandatory for a distribution,
# Harvester a warning of the dataset (distribution-incomplete), so the dataset is stored.
AP_SAMPLES = ["ckanext-dcatapchharvest/dataset-datetimes-bad.xml", "udata/geonetwork.xml"]
# The two samples that do not parse offline: broken Turtle (a run of it fails:
# test_a_document_that_is_not_a_catalogue_fails_the_run) and JSON-LD with a remote @context.
UNREADABLE_AP = {"example-bee-population-dataset-series-combined.ttl",
                 "example-bee-population-dataset-series-combined.jsonld"}
RDF_FORMATS = {".xml": ("xml", "application/rdf+xml"), ".rdf": ("xml", "application/rdf+xml"),
               ".ttl": ("turtle", "text/turtle"), ".jsonld": ("json-ld", "application/ld+json")}


@pytest.fixture(autouse=True)
def quiet_rdflib():
    """rdflib logs a traceback for every literal that does not fit its datatype."""
    logging.getLogger("rdflib").setLevel(logging.CRITICAL)
    yield
    logging.getLogger("rdflib").setLevel(logging.NOTSET)


# -- reading what the run left ---------------------------------------------------------------------
def last_run(db):
    return db.execute("SELECT run_id, status, error, stats FROM sync_runs ORDER BY run_id DESC LIMIT 1").fetchone()


def live_ids(db) -> set[str]:
    return {r[0] for r in db.execute("SELECT source_id FROM datasets WHERE removed_at IS NULL").fetchall()}


def rows(db, run_id: int, severity: str | None = None) -> list[dict]:
    """The run's outcome rows in listing order, without recorded_at (what a rewrite would change)."""
    columns = ("position", "source_id", "ordinal", "stage", "severity", "code", "field", "value", "message")
    found = db.execute(
        f"SELECT {', '.join(columns)} FROM record_outcomes WHERE run_id = %s AND severity = coalesce(%s, severity)"
        " ORDER BY position NULLS LAST, source_id, ordinal, code", (run_id, severity)).fetchall()
    return [dict(zip(columns, r)) for r in found]


def codes_by_position(found: list[dict]) -> dict[int, Counter]:
    out: dict[int, Counter] = {}
    for row in found:
        out.setdefault(row["position"], Counter())[row["code"]] += 1
    return out


def check_run_verdict(harvest_state: str, db, bad: int, total: int) -> tuple[int, dict]:
    """A catalogue whose records all fail fails its run, saying so; one with a usable record commits
    it and counts the others failed. Returns the run's id and stats."""
    run_id, status, error, stats = last_run(db)
    if bad == total:
        assert (harvest_state, status) == ("failed", "failed"), error
        assert f"all {total} records" in error and "failed" in error, error
        assert live_ids(db) == set()
    else:
        assert (harvest_state, status) == ("success", "committed"), error
        assert stats["failed"] == bad
    return run_id, stats


def table_counts(db) -> dict[str, int]:
    """Rows of every table of the harvester database."""
    tables = [r[0] for r in db.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'").fetchall()]
    return {t: db.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0] for t in tables}


def check_validate_says_what_the_harvest_did(db, run_id: int, path, kind: str, capsys) -> None:
    """`harvester validate` of the sample's file prints the groups the harvest wrote (a first run
    writes every record's problems), and writes nothing to the database."""
    from harvester.cli.main import main
    from harvester.store import outcomes

    before = table_counts(db)
    capsys.readouterr()
    code = main(["validate", str(path), "--type", kind, "--json"])
    printed = json.loads(capsys.readouterr().out)
    harvested = outcomes.groups(db, run_id)
    assert printed["groups"] == harvested
    assert code == (1 if any(g["severity"] == "error" for g in harvested) else 0)
    assert table_counts(db) == before


def check_warned_records_are_stored(db, run_id: int, stored: int) -> None:
    """Warnings never drop a record: every record with warning rows (and no error) is a live
    dataset, and the run stored every record that had no error."""
    found = rows(db, run_id)
    errored = {r["position"] for r in found if r["severity"] == "error"}
    warned = {r["source_id"] for r in found if r["severity"] == "warning" and r["position"] not in errored}
    live = live_ids(db)
    assert warned <= live, warned - live
    assert len(live) == stored


# -- the lists are every broken sample ----------------------------------------------------------------
def test_the_lists_name_every_broken_sample():
    """The one-run lists (and the second-run sample) are exactly the samples with a failing record,
    worked out from the files, so a new broken sample cannot go unharvested."""
    broken = set()
    for path in sorted(US.rglob("*.json")):
        if any(expected_outcomes(json.loads(path.read_bytes()))):
            broken.add(str(path.relative_to(US)))
    assert broken == set(BROKEN_US) | {TWICE}
    failing_ap = set()
    for path in sorted(p for p in AP.rglob("*") if p.suffix in RDF_FORMATS and p.name not in UNREADABLE_AP):
        graph = rdf_graph(path, "http://samples.test/" + path.name)
        if any(not expected_dataset(graph, d)[1] for d in set(graph.subjects(RDF.type, DCAT.Dataset))):
            failing_ap.add(str(path.relative_to(AP)))
    assert failing_ap == {"ckanext-dcatapchharvest/dataset-datetimes-bad.xml"}


# -- DCAT-US --------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", BROKEN_US)
def test_a_broken_dcat_us_sample_leaves_the_error_rows_its_schema_and_rules_say(name, harvest, catalogue, db, gemini,
                                                                                capsys):
    path = US / name
    document = json.loads(path.read_bytes())
    expected = expected_outcomes(document)
    bad = sum(1 for c in expected if c)
    assert bad  # a broken sample
    catalogue.set_document("/data.json", path.read_bytes())
    harvest.configure(catalogue.url("/data.json"), type="dcat-json")
    state = harvest.run().state
    run_id, stats = check_run_verdict(state, db, bad, len(expected))
    errors = rows(db, run_id, "error")
    assert codes_by_position(errors) == {i + 1: c for i, c in enumerate(expected) if c}
    assert all(r["message"] and r["stage"] in ("parse", "validate") for r in errors)
    # The failed records with an identifier are named by it (the report's labels).
    entries = [e for e, _ in listed_entries(document)]
    assert len(entries) == len(expected)  # (these samples embed no second copy of a dataset)
    named = {identifier_of(entries[p - 1]) for p in codes_by_position(errors)} - {None}
    assert named <= {r["source_id"] for r in errors}
    check_warned_records_are_stored(db, run_id, len(expected) - bad)
    check_validate_says_what_the_harvest_did(db, run_id, path, "dcat-json", capsys)


# -- DCAT-AP --------------------------------------------------------------------------------------
def rdf_graph(path, url: str) -> Graph:
    """The sample as rdflib parses it by its suffix (not through the source's parser)."""
    graph = Graph()
    graph.parse(data=path.read_bytes(), format=RDF_FORMATS[path.suffix][0], publicID=url)
    return graph


def row_key(row: dict) -> tuple:
    """A row as the oracle writes a problem: (code, field, value), bad-optional-date's field "*",
    a distribution's place in the field as "_"."""
    field = "*" if row["code"] == "bad-optional-date" else re.sub(r"\[\d+\]", "[_]", row["field"] or "")
    return row["code"], field or None, row["value"]


@pytest.mark.parametrize("name", AP_SAMPLES)
def test_a_dcat_ap_sample_leaves_the_rows_its_rules_say(name, harvest, catalogue, db, gemini, capsys):
    path = AP / name
    url = catalogue.url("/catalog" + path.suffix)
    graph = rdf_graph(path, url)
    verdicts = [expected_dataset(graph, d) for d in set(graph.subjects(RDF.type, DCAT.Dataset))]
    bad = sum(1 for _, ok, _ in verdicts if not ok)
    catalogue.set_document("/catalog" + path.suffix, path.read_bytes(), RDF_FORMATS[path.suffix][1])
    harvest.configure(url, type="dcat-rdf")
    state = harvest.run().state
    run_id, stats = check_run_verdict(state, db, bad, len(verdicts))
    found = rows(db, run_id)
    want_errors = sum((problems for _, ok, problems in verdicts if not ok), Counter())
    assert Counter(row_key(r) for r in found if r["severity"] == "error") == want_errors
    # The stored datasets' warnings of the DCAT-AP rules, by dataset.
    want_warnings = {ident: problems for ident, ok, problems in verdicts if ok}
    got_warnings = {ident: Counter(row_key(r) for r in found if r["source_id"] == ident and r["severity"] == "warning"
                                   and r["code"] in RULE_CODES) for ident in want_warnings}
    assert got_warnings == want_warnings
    assert set(want_warnings) == live_ids(db)
    check_warned_records_are_stored(db, run_id, len(verdicts) - bad)
    check_validate_says_what_the_harvest_did(db, run_id, path, "dcat-rdf", capsys)


# -- not a catalogue ------------------------------------------------------------------------------
NOT_CATALOGUES = {
    # broken Turtle (an unterminated statement): rdflib refuses it
    "bee-population-ttl": ("/catalog.ttl", "dcat-rdf", "text/turtle",
                           lambda: (AP / "semiceu-dcat-ap" / "example-bee-population-dataset-series-combined.ttl")
                           .read_bytes()),
    # a portal's HTML page where its data.json should be
    "html-page": ("/data.json", "dcat-json", "text/html",
                  lambda: sample_path("http-500-html.html", sample_path("errors")).read_bytes()),
    # a JSON object that is not a catalogue: no "dataset"
    "json-without-dataset": ("/data.json", "dcat-json", "application/json",
                             lambda: json.dumps({"@type": "dcat:Catalog", "title": "no datasets here"}).encode()),
}


@pytest.mark.parametrize("case", sorted(NOT_CATALOGUES))
def test_a_document_that_is_not_a_catalogue_fails_the_run(case, harvest, catalogue, db, gemini):
    where, kind, content_type, body = NOT_CATALOGUES[case]
    catalogue.set_document(where, body(), content_type)
    harvest.configure(catalogue.url(where), type=kind)
    assert harvest.run().state == "failed"
    run_id, status, error, stats = last_run(db)
    assert status == "failed" and error, error
    assert live_ids(db) == set()


def test_the_bee_population_turtle_is_not_turtle():
    """The reason the first case above fails, shown with rdflib alone."""
    path = AP / "semiceu-dcat-ap" / "example-bee-population-dataset-series-combined.ttl"
    with pytest.raises(Exception):
        Graph().parse(data=path.read_bytes(), format="turtle")


# -- CKAN -----------------------------------------------------------------------------------------
def parses_as_date(value) -> bool:
    """CKAN's metadata_modified as the DAG must read it: ISO 8601 (a space for the T allowed)."""
    try:
        datetime.fromisoformat(value.strip())
        return True
    except (AttributeError, ValueError):
        return False


def ckan_errors(pkg: dict) -> Counter:
    """The codes of a CKAN package's errors, restated from the rules: an id (a non-empty string), a
    name or a title, a metadata_modified that is a date when given."""
    if not isinstance(pkg.get("id"), str) or not pkg["id"].strip():
        return Counter({"no-identifier": 1})
    out = Counter()
    if not (isinstance(pkg.get("name"), str) and pkg["name"]) and not (
            isinstance(pkg.get("title"), str) and pkg["title"].strip()):
        out["no-title"] += 1
    if pkg.get("metadata_modified") not in (None, "") and not parses_as_date(pkg["metadata_modified"]):
        out["bad-date"] += 1
    return out


CKAN_FILES = ["data-birmingham-gov-uk.jsonl", "data-gov-uk.jsonl", "data-gov-au.jsonl", "dkan-hauts-de-france.jsonl"]


def broken_copies(pkg: dict) -> list[dict]:
    """No sample file holds a broken record (test_ckan_samples_hold_no_broken_record): four broken
    copies of a real one, one per rule and one breaking two."""
    def copy_with(drop: str | None = None, **changes) -> dict:
        out = {**copy.deepcopy(pkg), **changes}
        out.pop(drop, None)
        return out

    return [copy_with(drop="id", name=pkg["name"] + "-no-id"),
            copy_with(id=pkg["id"] + "-bad-date", name=pkg["name"] + "-bad-date", metadata_modified="last tuesday"),
            copy_with(id=pkg["id"] + "-untitled", name="", title="  "),
            copy_with(id=pkg["id"] + "-both", name=None, title=None, metadata_modified="2021-02-30T00:00:00")]


def test_ckan_samples_hold_no_broken_record():
    """Why test_ckan_broken_records adds broken copies: no record of any sample file breaks a rule."""
    for path in sorted(sample_path("catalog-data-gov.jsonl").parent.glob("*.jsonl")):
        assert not any(ckan_errors(pkg) for pkg in load_samples(path.name)), path.name


def test_ckan_broken_records_leave_their_error_rows_and_the_others_land(harvest, portal_server, db, gemini):
    records = [pkg for name in CKAN_FILES for pkg in load_samples(name)]
    served = records + broken_copies(records[0])
    portal_server.set_records(served)
    harvest.configure(portal_server.base_url)
    state = harvest.run().state
    want = {pkg.get("id") or pkg["name"]: ckan_errors(pkg) for pkg in served}
    bad = {key: codes for key, codes in want.items() if codes}
    assert len(bad) == 4
    run_id, stats = check_run_verdict(state, db, len(bad), len(served))
    errors = rows(db, run_id, "error")
    got: dict[str, Counter] = {}
    for r in errors:
        got.setdefault(r["source_id"], Counter())[r["code"]] += 1
    # a record without an id has no source_id: it is known by the name its message quotes
    nameless = got.pop(None)
    assert nameless == Counter({"no-identifier": 1})
    [no_id] = [r for r in errors if r["source_id"] is None]
    assert records[0]["name"] + "-no-id" in no_id["message"]
    assert got == {key: codes for key, codes in bad.items() if key != records[0]["name"] + "-no-id"}
    check_warned_records_are_stored(db, run_id, len(served) - len(bad))
    assert live_ids(db) == {pkg["id"] for pkg in records}


# -- a second run ---------------------------------------------------------------------------------
def test_a_second_run_of_the_same_catalogue_writes_no_row_of_the_first_again(harvest, catalogue, db, gemini):
    """dcatus3_0.json twice. Served unchanged, the second run's conditional request is answered 304
    and it reads nothing (no row at all); so the run that matters changes one good entry's
    description: the catalogue is read whole again, the still-failing record's errors are said
    again, the changed entry's warnings are said (it is updated), the unchanged ones' are not, and
    the first run's rows are as they were."""
    path = US / TWICE
    document = json.loads(path.read_bytes())
    expected = expected_outcomes(document)
    assert any(expected) and not all(expected)
    catalogue.set_document("/data.json", path.read_bytes())
    harvest.configure(catalogue.url("/data.json"), type="dcat-json")
    assert harvest.run().state == "success"
    first, _, _, stats = last_run(db)
    rows1 = rows(db, first)
    errors1 = [r for r in rows1 if r["severity"] == "error"]
    assert codes_by_position(errors1) == {i + 1: c for i, c in enumerate(expected) if c}
    warned = {r["position"] for r in rows1 if r["severity"] == "warning"}
    assert warned, "the sample's stored records have warnings"
    check_warned_records_are_stored(db, first, len(expected) - sum(1 for c in expected if c))

    # Unchanged: 304, nothing read, nothing written.
    catalogue.requests.clear()
    assert harvest.run().state == "success"
    unchanged, _, _, stats = last_run(db)
    assert catalogue.requests[0][1].get("If-None-Match") and stats["fetched"] == 0
    assert rows(db, unchanged) == [] and rows(db, first) == rows1

    # One good entry (one with warnings) changed: read again.
    changed = sorted(warned)[0]
    entries = [e for e, embedded in listed_entries(document) if not embedded]
    target = entries[changed - 1]
    target["description"] = (target.get("description") or "") + " (revised)"
    catalogue.set_document("/data.json", json.dumps(document).encode())
    assert harvest.run().state == "success"
    second, _, _, stats = last_run(db)
    assert stats["fetched"] + stats["failed"] == len(expected) and stats["updated"] == 1
    rows2 = rows(db, second)
    assert rows(db, first) == rows1
    strip = ("position", "source_id", "ordinal", "stage", "code", "field", "value", "message")
    assert [{k: r[k] for k in strip} for r in rows2 if r["severity"] == "error"] == \
        [{k: r[k] for k in strip} for r in errors1]
    warnings2 = [r for r in rows2 if r["severity"] == "warning"]
    assert {r["position"] for r in warnings2} == {changed}
    assert [{k: r[k] for k in strip} for r in warnings2] == \
        [{k: r[k] for k in strip} for r in rows1 if r["severity"] == "warning" and r["position"] == changed]
