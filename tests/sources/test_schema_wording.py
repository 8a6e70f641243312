"""A schema violation says what the value should be in words, not as the schema's regular
expression (issue 38, finding 5): ``modified: 'desconocido' is not an ISO 8601 date (e.g.
2024-05-31 or 2024-05-31T12:00:00Z)``, in the records of a harvest, in `harvester validate` and in
the validation API's report alike (one wording: sources/schema_wording.py, used by dcat_json)."""
from __future__ import annotations

import asyncio
import csv
import io
import json
import re
import tempfile

import pytest
from jsonschema import Draft202012Validator, FormatChecker

from harvester.cli.main import main
from harvester.sources.dcat_json import iter_records, schema_problems
from harvester.sources.schema_wording import FORMATS, PATTERNS, SHOWN_PATTERN
from harvester.testing.expected_outcomes import POD_1_1, SCHEMAS

DATE_WORDS = "is not an ISO 8601 date (e.g. 2024-05-31 or 2024-05-31T12:00:00Z)"
# what a message quoting a regular expression of the schemas shows
REGEX_BITS = re.compile(r"\\d|\[0-9\]|\(\?|\{\d|\]\)\*|\\w|\^\(|\$'")


def schema_patterns() -> set[str]:
    found: set[str] = set()

    def walk(node):
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "pattern" and isinstance(value, str):
                    found.add(value)
                else:
                    walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    for path in SCHEMAS.rglob("*.json"):
        walk(json.loads(path.read_text()))
    return found


def entry_1_1(**fields) -> dict:
    """A DCAT-US 1.1 (non-federal) entry valid but for ``fields``."""
    return {"identifier": "x", "title": "Budget", "description": "d", "keyword": ["k"], "modified": "2024-05-31",
            "publisher": {"name": "Agency"}, "contactPoint": {"fn": "Desk", "hasEmail": "mailto:desk@example.gov"},
            "accessLevel": "public", **fields}


def problems_of(entry: dict) -> dict:
    record, = iter_records(io.BytesIO(json.dumps({"conformsTo": POD_1_1, "dataset": [entry]}).encode()),
                           "https://catalog.example.org/data.json")
    return {p.field: p for p in record.problems if p.code == "schema-violation"}


def test_every_pattern_of_the_vendored_schemas_has_a_name():
    """A schema brought in with a pattern of its own fails here until the pattern is named."""
    patterns = schema_patterns()
    assert len(patterns) >= 16
    assert sorted(p[:60] for p in patterns - set(PATTERNS)) == []


def test_a_date_that_is_not_one_says_so_in_words():
    """The issue's case: a data.json of datos.gob.ar's kind with modified 'desconocido'."""
    modified = problems_of(entry_1_1(modified="desconocido"))["modified"]
    assert modified.value == "desconocido"
    assert modified.message == f"modified: 'desconocido' {DATE_WORDS} (nor any other form it may take)"


@pytest.mark.parametrize("field, value, field_path, bad, words", [
    ("issued", "ayer", "issued", "ayer", DATE_WORDS),
    ("temporal", "siempre", "temporal", "siempre",
     "is not an ISO 8601 interval of two dates (e.g. 2020-01-01/2024-12-31)"),
    ("accrualPeriodicity", "often", "accrualPeriodicity", "often", "is not an ISO 8601 repeating duration (e.g. R/P1D"),
    ("bureauCode", ["1"], "bureauCode[0]", "1", "is not a bureau code (3 digits, a colon and 2 digits, e.g. 015:11)"),
    ("programCode", ["x"], "programCode[0]", "x",
     "is not a program code (3 digits, a colon and 3 digits, e.g. 015:001)"),
    ("primaryITInvestmentUII", "?", "primaryITInvestmentUII", "?", "is not an IT investment UII"),
    ("language", ["español"], "language[0]", "español", "is not a language tag (BCP 47, e.g. en or es-AR)"),
    ("distribution", [{"mediaType": "csv", "downloadURL": "https://example.gov/a.csv"}], "distribution[0].mediaType",
     "csv", "is not a media type (e.g. text/csv or application/json)"),
    ("contactPoint", {"fn": "Desk", "hasEmail": "desk@example.gov"}, "contactPoint.hasEmail", "desk@example.gov",
     "is not a mailto: e-mail address (e.g. mailto:data@example.gov)"),
])
def test_each_pattern_is_said_in_words_with_the_field_and_the_value(field, value, field_path, bad, words):
    found = problems_of(entry_1_1(**{field: value}))
    assert list(found) == [field_path]
    problem = found[field_path]
    assert problem.value == bad
    assert problem.message.startswith(f"{field_path}: {bad!r} {words}"), problem.message
    assert not REGEX_BITS.search(problem.message), problem.message


def test_a_dcat_us_3_0_pattern_is_said_in_words_too():
    entry = {"@type": "Dataset", "title": "t", "description": "d", "identifier": "x",
             "contactPoint": {"@type": "Kind", "fn": "Desk", "hasEmail": "desk"},
             "publisher": {"@type": "Organization", "name": "Agency"}}
    record, = iter_records(io.BytesIO(json.dumps({"conformsTo": {"@type": "Standard", "title": "DCAT-US 3.0"},
                                                  "dataset": [entry]}).encode()), "https://x.example/data.json")
    assert [p.message for p in record.problems] == [
        "contactPoint.hasEmail: 'desk' is not a mailto: e-mail address (e.g. mailto:data@example.gov)"]


def test_an_unknown_pattern_is_the_expected_form_with_the_pattern_once_and_short():
    pattern = "^[A-Z]{2}-" + "[0-9]" * 40 + "$"
    validator = Draft202012Validator({"type": "object", "properties": {"code": {"pattern": pattern}}})
    problem, = schema_problems(validator, {"code": "nope"})
    assert problem.message == (f"code: 'nope' does not have the expected form (pattern "
                               f"{pattern[:SHOWN_PATTERN] + '...'!r})")
    assert problem.message.count("[A-Z]") == 1
    short = Draft202012Validator({"properties": {"code": {"pattern": "^[A-Z]{2}$"}}})
    assert schema_problems(short, {"code": "x"})[0].message == (
        "code: 'x' does not have the expected form (pattern '^[A-Z]{2}$')")


def test_a_format_is_said_in_words_and_a_long_value_is_cut():
    validator = Draft202012Validator({"properties": {"issued": {"format": "date"}}},
                                     format_checker=FormatChecker(formats=("date",)))
    value = "the thirty-first of May, two thousand and twenty-four, in the afternoon"
    problem, = schema_problems(validator, {"issued": value})
    assert problem.message == f"issued: {value[:60] + '...'!r} is not {FORMATS['date']}"
    assert problem.value == value


def test_harvester_validate_shows_the_words(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HARVESTER_EMBEDDED_DB", "off")
    path = tmp_path / "data.json"
    path.write_text(json.dumps({"conformsTo": POD_1_1, "dataset": [entry_1_1(modified="desconocido")]}))
    assert main(["validate", str(path), "--csv", "-"]) == 1
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [(r["field"], r["value"], r["message"]) for r in rows] == [
        ("modified", "desconocido", f"modified: 'desconocido' {DATE_WORDS} (nor any other form it may take)")]
    assert main(["validate", str(path)]) == 1
    shown = " ".join(capsys.readouterr().out.split())
    assert "is not an ISO 8601 date" in shown and "\\d" not in shown


def test_the_validation_apis_report_shows_the_words():
    """The API validates in a child process (pipeline/validate_worker.py): its report's groups and
    rows carry the same words."""
    from harvester.http.guard import FetchPolicy
    from harvester.pipeline import validate_worker as worker

    document = json.dumps({"conformsTo": POD_1_1, "dataset": [entry_1_1(modified="desconocido")]}).encode()
    policy = FetchPolicy(allow_private=False, max_bytes=10 * 1024 ** 2, timeout=30, deadline=30)
    with tempfile.TemporaryFile() as fp:
        fp.write(document)
        fp.flush()
        outcome = asyncio.run(worker.run({"name": "data.json", "kind": "dcat-json", "rows": 100,
                                          "policy": worker.policy_fields(policy)},
                                         deadline=30, memory=1024 ** 3, document=fp.fileno()))
    assert outcome.error is None, outcome.error
    expected = f"modified: 'desconocido' {DATE_WORDS} (nor any other form it may take)"
    assert [row["message"] for row in outcome.report["rows"]] == [expected]
    assert [group["message"] for group in outcome.report["groups"]] == [expected]
