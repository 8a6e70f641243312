"""`harvester report` over a real harvest into the test database, and `harvester validate`, which
reads a catalogue as that harvest did and writes nothing anywhere."""
from __future__ import annotations

import csv
import io
import json
import re

import pytest
import yaml

from harvester.cli.main import main
from harvester.testing.dcat_portal import DcatServer
from harvester.testing.samples import dcat_samples_dir

SAMPLE = dcat_samples_dir() / "dcat-us" / "dcatus3_0.json"  # 4 datasets: 1 without a usable identifier
LOG_LINE = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d")
BROKEN = dcat_samples_dir() / "dcat-us" / "ckanext-datajson" / "missing-identifier-title.data.json"


@pytest.fixture
def catalogue():
    with DcatServer() as server:
        server.set_document("/data.json", SAMPLE.read_bytes())
        yield server


def configure(tmp_path, monkeypatch, url: str) -> None:
    path = tmp_path / "portals.yaml"
    path.write_text(yaml.safe_dump({"portals": [{"name": "dcattest", "url": url, "type": "dcat-json",
                                                 "politeness_delay": 0}]}))
    monkeypatch.setenv("HARVESTER_PORTALS_FILE", str(path))


def table_counts(conn) -> dict[str, int]:
    tables = [r[0] for r in conn.execute("SELECT table_name FROM information_schema.tables"
                                         " WHERE table_schema = 'public' AND table_type = 'BASE TABLE'").fetchall()]
    return {t: conn.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0] for t in tables}


def run_json(capsys, *argv) -> tuple[int, dict]:
    code = main([*argv, "--json"])
    return code, json.loads(capsys.readouterr().out)


# -- validate ---------------------------------------------------------------------------------------------
def test_validate_prints_the_groups_and_exits_1_when_records_fail(capsys, monkeypatch):
    from harvester.pipeline.validate import validate_path

    monkeypatch.delenv("HARVESTER_DATABASE_URL", raising=False)
    monkeypatch.setenv("HARVESTER_EMBEDDED_DB", "off")  # no database at all: validate needs none
    code, shown = run_json(capsys, "validate", str(BROKEN))
    assert code == 1
    expected = validate_path(BROKEN)
    assert shown["groups"] == expected.groups and shown["failed"] == 2 and shown["records"] == 3
    assert shown["kind"] == "dcat-json" and "from the content" in shown["guessed"]

    assert main(["validate", str(BROKEN)]) == 1
    out = capsys.readouterr().out
    assert "3 records" in out and "2 failed" in out
    for group in expected.groups:
        assert group["code"] in out and group["examples"][0] in out

    # a catalogue whose records all pass: 0; not a catalogue: 2, saying why
    assert main(["validate", str(dcat_samples_dir() / "dcat-us" / "ckanext-datajson" / "arm.data.json")]) == 0
    capsys.readouterr()
    assert main(["validate", str(SAMPLE), "--type", "ckan"]) == 2
    assert "not a CKAN package_search" in capsys.readouterr().err


def test_validate_writes_csv(tmp_path, capsys):
    target = tmp_path / "rows.csv"
    assert main(["validate", str(BROKEN), "--csv", str(target)]) == 1
    assert "wrote 2 rows" in capsys.readouterr().err
    rows = list(csv.DictReader(target.open(encoding="utf-8")))
    assert {r["code"] for r in rows} == {"no-identifier", "no-title"} and len(rows) == 2
    assert main(["validate", str(BROKEN), "--csv", "-"]) == 1
    # (the test process's logging, Airflow's, writes INFO lines to stdout; the command logs at WARNING)
    out = "".join(line for line in capsys.readouterr().out.splitlines(True) if not LOG_LINE.match(line))
    assert list(csv.DictReader(io.StringIO(out))) == rows


def test_validate_keeps_the_first_rows_and_counts_them_all(tmp_path, capsys):
    """The row cap of a validation (issue 35) holds on the command line too: --max-rows, 10000 by default."""
    target = tmp_path / "rows.csv"
    assert main(["validate", str(BROKEN), "--csv", str(target), "--max-rows", "1"]) == 1
    err = capsys.readouterr().err
    assert "wrote 1 rows" in err and "kept the first 1 of 2 rows (--max-rows)" in err
    assert len(list(csv.DictReader(target.open(encoding="utf-8")))) == 1
    code, shown = run_json(capsys, "validate", str(BROKEN), "--max-rows", "1")
    assert code == 1 and shown["rows_total"] == 2 and sum(g["count"] for g in shown["groups"]) == 2

# -- report after a harvest ------------------------------------------------------------------------------
def test_report_shows_the_runs_groups_and_validate_the_same_writing_nothing(database_url, db, catalogue, tmp_path,
                                                                            monkeypatch, capsys):
    from harvester.store import outcomes

    url = catalogue.url("/data.json")
    configure(tmp_path, monkeypatch, url)
    code, stats = run_json(capsys, "harvest", "dcattest")
    assert code == 0 and stats["created"] == 3
    run_id = db.execute("SELECT max(run_id) FROM sync_runs").fetchone()[0]
    stored = outcomes.groups(db, run_id)
    assert {g["code"] for g in stored} >= {"no-identifier", "no-distribution", "no-license"}

    code, by_id = run_json(capsys, "report", str(run_id))
    assert code == 0 and by_id["groups"] == stored
    assert by_id["run"]["run_id"] == run_id and by_id["counts"] == outcomes.counts(db, [run_id])[run_id]
    code, last = run_json(capsys, "report", "--portal", "dcattest", "--last")
    assert code == 0 and last == by_id
    code, errors = run_json(capsys, "report", str(run_id), "--severity", "error")
    assert errors["groups"] == outcomes.groups(db, run_id, severity="error") == [g for g in stored
                                                                                 if g["severity"] == "error"]

    assert main(["report", str(run_id)]) == 0
    out = capsys.readouterr().out
    assert f"run {run_id} of dcattest" in out
    for group in stored:
        assert group["code"] in out

    target = tmp_path / "rows.csv"
    assert main(["report", str(run_id), "--csv", str(target)]) == 0
    capsys.readouterr()
    written = list(csv.DictReader(target.open(encoding="utf-8")))
    expected = list(outcomes.iter_rows(db, run_id))
    assert len(written) == len(expected) == sum(g["count"] for g in stored)
    assert [(r["position"], r["source_id"], r["code"]) for r in written] == [
        (str(r["position"] or ""), r["source_id"] or "", r["code"]) for r in expected]

    # validating the same catalogue: the groups of the run, and not a row written anywhere
    before = table_counts(db)
    code, validated = run_json(capsys, "validate", url)
    assert code == 1 and validated["groups"] == stored
    assert main(["validate", url, "--csv", str(tmp_path / "v.csv")]) == 1
    assert table_counts(db) == before
    assert len(catalogue.requests) >= 3  # it did read the catalogue (the harvest, then twice validate)

    # a severity the run has none of (its errors gone here): the table says so, as the counts line
    # does, instead of "no errors or warnings" under "0 errors, 2 warnings"
    db.execute("DELETE FROM record_outcomes WHERE run_id = %s AND severity = 'error'", (run_id,))
    capsys.readouterr()
    assert main(["report", str(run_id), "--severity", "error"]) == 0
    shown = capsys.readouterr().out.splitlines()
    assert shown[1].startswith("0 errors, ") and shown[1].endswith(" warnings (shown: errors)")
    assert shown[2] == f"Record outcomes of run {run_id}: no errors"


def test_report_errors_exit_2(database_url, tmp_path, monkeypatch, capsys):
    configure(tmp_path, monkeypatch, "https://example.org/data.json")
    assert main(["report", "999999"]) == 2
    assert "no run with run_id 999999" in capsys.readouterr().err
    assert main(["report", "--portal", "dcattest", "--last"]) == 2
    assert "has no runs yet" in capsys.readouterr().err
    assert main(["report"]) == 2
    assert "give a run id" in capsys.readouterr().err
