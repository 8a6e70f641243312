"""`harvester export datasets | changes`: rows harvested from local CKAN portals by the real pipeline,
written as Parquet, CSV and JSON Lines, read back with pyarrow, the csv module and DuckDB."""
from __future__ import annotations

import copy
import csv
import hashlib
import io
import json
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import duckdb
import pyarrow.json as pa_json
import pyarrow.parquet as pq
import pytest
import yaml

from harvester.cli.main import main
from harvester.testing.ckan_portal import DemoPortal

ROOT = Path(__file__).resolve().parents[2]
FORMATS = ("parquet", "csv", "jsonl")
ODD_TITLE = 'Zürich «Steuern» "quoted", with a comma; 東京 ✓'
_MICROSECOND = timedelta(microseconds=1)
ODD_NOTES = 'first line\nsecond "quoted" line, a comma\r\nthird line: ünïcödé \\ backslash'


def _records(samples) -> list[dict]:
    records = samples("data-gov-au.jsonl")
    records[0] = {**records[0], "title": ODD_TITLE, "notes": ODD_NOTES}
    return records


@pytest.fixture
def harvested(database_url, portal_server, samples, tmp_path, monkeypatch):
    """Portal 'exa' (six datasets, then one retitled and one removed) and portal 'exb' (two), each
    harvested through the CLI; returns the instant between exa's first and second run, and exa's records."""
    records = _records(samples)
    portal_server.set_records(records)
    with DemoPortal(records=copy.deepcopy(records[:2])) as other:
        path = tmp_path / "portals.yaml"
        path.write_text(yaml.safe_dump({"portals": [
            {"name": "exa", "url": portal_server.base_url, "politeness_delay": 0},
            {"name": "exb", "url": other.base_url, "politeness_delay": 0}]}))
        monkeypatch.setenv("HARVESTER_PORTALS_FILE", str(path))
        assert main(["harvest", "exa"]) == 0
        assert main(["harvest", "exb"]) == 0
    time.sleep(0.01)
    between = datetime.now(timezone.utc)
    time.sleep(0.01)
    retitled = {**records[1], "title": records[1]["title"] + " (revised)"}
    rewritten = {**records[2], "notes": "An entirely different account of what this dataset holds. " * 5}
    portal_server.set_records([records[0], retitled, rewritten, *records[3:5]])
    assert main(["harvest", "exa", "--full", "--force-removals"]) == 0
    monkeypatch.chdir(tmp_path)
    return between, records


def export(capsys, *args) -> dict:
    assert main(["export", *args, "--json"]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def rows_read(path: Path, fmt: str) -> list[dict]:
    """The file's rows as pyarrow (Parquet, JSON Lines) or the csv module (CSV) read them."""
    if fmt == "parquet":
        return pq.read_table(path).to_pylist()
    if fmt == "jsonl":
        return pa_json.read_json(path).to_pylist() if path.stat().st_size else []
    with open(path, encoding="utf-8", newline="") as f:
        return list(csv.DictReader(f))


def duck(path: Path, fmt: str, select: str = "count(*)") -> list[tuple]:
    reader = {"parquet": f"'{path}'", "csv": f"read_csv_auto('{path}')", "jsonl": f"read_json_auto('{path}')"}[fmt]
    return duckdb.sql(f"SELECT {select} FROM {reader}").fetchall()


def typed(value, kind: str):
    """A value as read back (CSV: text), as the database's Python value of the column's type (CSV
    writes null as an empty field, so "" reads as null)."""
    if value in (None, ""):
        return None
    if kind in ("int32", "int64"):
        return int(value)
    if kind == "float64":
        return float(value)
    if kind == "bool":
        return value if isinstance(value, bool) else {"true": True, "false": False}[value]
    if kind == "timestamp":
        return instant(value)
    if kind == "json":
        return json.loads(value)
    return value


def instant(value) -> datetime | None:
    if value in (None, ""):
        return None
    return value if isinstance(value, datetime) else datetime.fromisoformat(value)


@pytest.mark.parametrize("fmt", FORMATS)
def test_datasets_round_trip_in_every_format(harvested, db, capsys, tmp_path, fmt):
    between, records = harvested
    # the pipeline folds whitespace; the export must carry any text, line breaks included
    db.execute("UPDATE datasets SET description = %s WHERE title = %s", (ODD_NOTES, ODD_TITLE))
    out = tmp_path / f"all-{fmt}"
    manifest = export(capsys, "datasets", "--format", fmt, "--include-removed", "--raw", "--output", str(out))
    (item,) = manifest["files"]
    path = out / item["path"]
    assert item["path"] == f"datasets.{fmt}" and sorted(p.name for p in out.iterdir()) == [item["path"], "manifest.json"]
    assert json.loads((out / "manifest.json").read_text()) == manifest
    assert item["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest() and item["bytes"] == path.stat().st_size
    (total,) = db.execute("SELECT count(*) FROM datasets").fetchone()
    rows = rows_read(path, fmt)
    assert item["rows"] == total == len(rows) == 8 == duck(path, fmt)[0][0]
    assert [c["name"] for c in manifest["columns"]][-1] == "raw" and list(rows[0]) == [c["name"] for c in manifest["columns"]]
    assert (manifest["schema_version"], manifest["what"], manifest["format"]) == (1, "datasets", fmt)
    assert manifest["filters"] == {"portal": None, "portal_url": None, "since": None, "include_removed": True,
                                   "raw": True}
    runs = db.execute("SELECT portal_url, max(run_id) FROM sync_runs WHERE status = 'committed' GROUP BY 1").fetchall()
    assert sorted((r["portal_url"], r["run_id"]) for r in manifest["runs"]) == sorted(runs)
    assert {r["portal_name"] for r in manifest["runs"]} == {"exa", "exb"}

    db_rows = {r[0]: r[1:] for r in db.execute(
        "SELECT d.id, d.title, d.description, d.updated_at, d.removed_at, d.tags, d.raw, v.version_number"
        " FROM datasets d JOIN dataset_versions v ON v.dataset_id = d.id AND v.is_current").fetchall()}
    for row in rows:
        title, description, updated_at, removed_at, tags, raw, version = db_rows[int(row["dataset_id"])]
        assert (row["title"], row["description"]) == (title, description)
        assert (instant(row["updated_at"]), instant(row["removed_at"])) == (updated_at, removed_at)
        got_tags = json.loads(row["tags"]) if fmt == "csv" else row["tags"]
        assert got_tags == tags and json.loads(row["raw"]) == raw and int(row["version"]) == version
    odd = [r for r in rows if r["title"] == ODD_TITLE]
    assert len(odd) == 2 and all(r["description"] == ODD_NOTES for r in odd)
    groups = dict(db.execute("SELECT dataset_id, group_id FROM duplicate_members").fetchall())
    assert {int(r["dataset_id"]): int(r["group_id"]) for r in rows if r["group_id"] not in (None, "")} == groups
    source = next(r for r in rows if r["source_id"] == records[0]["id"])
    formats = json.loads(source["formats"]) if fmt == "csv" else source["formats"]
    assert formats == sorted({res["format"].strip() for res in records[0]["resources"] if res.get("format")})
    assert source["license"] == records[0]["license_title"]

    # DuckDB reads the same values without options: unicode, quotes and newlines, and the instants.
    got = duck(path, fmt, "dataset_id, title, description, epoch_us(CAST(updated_at AS TIMESTAMPTZ))")
    epoch = datetime(1970, 1, 1, tzinfo=timezone.utc)
    assert sorted((int(i), t, d, us) for i, t, d, us in got) == sorted(
        (i, t, d, (u - epoch) // _MICROSECOND) for i, (t, d, u, *_) in db_rows.items())


def test_filters_portal_since_and_removed(harvested, db, capsys, tmp_path):
    between, records = harvested
    live = export(capsys, "datasets", "--format", "parquet", "-o", str(tmp_path / "live"))
    assert live["files"][0]["rows"] == 7 and "raw" not in [c["name"] for c in live["columns"]]
    assert all(r["removed_at"] is None for r in pq.read_table(tmp_path / "live" / "datasets.parquet").to_pylist())

    only_b = export(capsys, "datasets", "--format", "csv", "--portal", "exb", "-o", str(tmp_path / "b"))
    assert only_b["files"][0]["rows"] == 2 and only_b["filters"]["portal"] == "exb"
    assert {r["portal_name"] for r in rows_read(tmp_path / "b" / "datasets.csv", "csv")} == {"exb"}
    assert [r["portal_name"] for r in only_b["runs"]] == ["exb"]

    since = between.isoformat()
    changed = export(capsys, "datasets", "--format", "jsonl", "--since", since, "--include-removed",
                     "-o", str(tmp_path / "since"))
    got = rows_read(tmp_path / "since" / "datasets.jsonl", "jsonl")
    assert changed["filters"]["since"] == since
    assert sorted((r["source_id"], r["removed_at"] is not None) for r in got) == \
        sorted([(records[1]["id"], False), (records[2]["id"], False), (records[5]["id"], True)])
    assert export(capsys, "datasets", "--format", "jsonl", "--since", since, "-o", str(tmp_path / "since-live")
                  )["files"][0]["rows"] == 2

    # nothing to export: the Parquet file still has every column, typed
    empty = export(capsys, "datasets", "--format", "parquet", "--since", "2999-01-01", "-o", str(tmp_path / "none"))
    table = pq.read_table(tmp_path / "none" / "datasets.parquet")
    assert empty["files"][0]["rows"] == table.num_rows == 0
    assert table.schema.names == [c["name"] for c in empty["columns"]]
    assert str(table.schema.field("updated_at").type) == "timestamp[us, tz=UTC]"
    assert str(table.schema.field("tags").type) == "list<element: string>"


@pytest.mark.parametrize("fmt", FORMATS)
def test_changes_export_counts_the_changes(harvested, db, capsys, tmp_path, fmt):
    between, _ = harvested
    (first,) = db.execute("SELECT min(id) FROM dataset_changes").fetchone()
    assert main(["review", str(first), "--by", "tester", "--note", "fine"]) == 0
    capsys.readouterr()
    manifest = export(capsys, "changes", "--format", fmt, "-o", str(tmp_path / "c"))
    path = tmp_path / "c" / f"changes.{fmt}"
    (total,) = db.execute("SELECT count(*) FROM dataset_changes").fetchone()
    rows = rows_read(path, fmt)
    assert manifest["files"][0]["rows"] == total == len(rows) == duck(path, fmt)[0][0] == 11
    assert manifest["files"][0]["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    kinds = {c["name"]: c["type"] for c in manifest["columns"]}
    # the summary is the words `harvester changes` prints for the change
    from harvester.store.history import describe

    assert [r["summary"] for r in rows] == [describe(r["change_type"], json.loads(r["changed_fields"])) for r in rows]
    kinds.pop("summary")
    expected = db.execute(
        "SELECT c.id, c.dataset_id, p.portal_name, d.portal_url, d.source_id, d.title, d.url, c.change_type,"
        " c.changed_fields, c.significance_score::float8, c.requires_review, c.review_outcome, c.old_version,"
        " c.new_version, c.detected_at, c.run_id FROM dataset_changes c JOIN datasets d ON d.id = c.dataset_id"
        " JOIN portal_sync_status p USING (portal_url) ORDER BY c.detected_at, c.id").fetchall()
    assert [tuple(typed(row[name], kinds[name]) for name in kinds) for row in rows] == expected
    assert sorted(r[7] for r in expected) == ["content_updated"] + ["new"] * 8 + ["removed", "title_changed"]
    assert expected[0][11] == "reviewed" and all(r[11] is None for r in expected[1:])

    since = export(capsys, "changes", "--format", fmt, "--portal", "exa", "--since", between.isoformat(),
                   "-o", str(tmp_path / "s"))
    (recent,) = db.execute("SELECT count(*) FROM dataset_changes WHERE detected_at >= %s", (between,)).fetchone()
    assert since["files"][0]["rows"] == recent == 3 and "include_removed" not in since["filters"]


def test_groups_and_refusals(harvested, db, capsys, tmp_path):
    ids = [r[0] for r in db.execute("SELECT id FROM datasets WHERE removed_at IS NULL ORDER BY id LIMIT 3")]
    db.execute("DELETE FROM duplicate_members")  # whatever the runs grouped: these three, and the rest alone
    db.execute("INSERT INTO duplicate_members (dataset_id, group_id, portal_url, is_canonical, evidence, confidence)"
               " SELECT d.id, 42, d.portal_url, d.id = %s, 'identifier', 1 FROM datasets d WHERE d.id = ANY(%s)",
               (ids[0], ids))
    out = tmp_path / "groups"
    assert main(["export", "datasets", "--format", "parquet", "-o", str(out)]) == 0
    summary = capsys.readouterr().out
    assert f"exported 7 datasets to {out / 'datasets.parquet'}" in summary and "manifest.json" in summary
    rows = {r["dataset_id"]: r for r in pq.read_table(out / "datasets.parquet").to_pylist()}
    assert [(rows[i]["group_id"], rows[i]["is_canonical"], rows[i]["canonical_dataset_id"], rows[i]["copies"])
            for i in ids] == [(42, True, ids[0], 2), (42, False, ids[0], 2), (42, False, ids[0], 2)]
    alone = [r for i, r in rows.items() if i not in ids]
    assert alone and all((r["group_id"], r["is_canonical"], r["canonical_dataset_id"], r["copies"]) ==
                         (None, None, None, 0) for r in alone)

    # the files of an earlier export stay unless --force
    before = (out / "datasets.parquet").read_bytes()
    assert main(["export", "datasets", "--format", "parquet", "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"{out / 'datasets.parquet'} and {out / 'manifest.json'} exist already" in err and "--force" in err
    assert (out / "datasets.parquet").read_bytes() == before
    assert main(["export", "datasets", "--format", "parquet", "-o", str(out), "--portal", "exb", "--force"]) == 0
    assert pq.read_table(out / "datasets.parquet").num_rows == 2
    capsys.readouterr()

    # the default directory: new, in the current one
    assert main(["export", "changes", "--format", "csv"]) == 0
    (made,) = [p for p in Path.cwd().iterdir() if p.name.startswith("export-changes-")]
    assert sorted(p.name for p in made.iterdir()) == ["changes.csv", "manifest.json"]
    capsys.readouterr()

    assert main(["export", "datasets", "--format", "csv", "--portal", "nope"]) == 2
    assert "no portal named 'nope'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:
        main(["export", "datasets", "--format", "xlsx"])
    assert exited.value.code == 2 and "invalid choice: 'xlsx'" in capsys.readouterr().err


def test_the_memory_bench_runs_small(database_url, tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "export_bench.py"), "--datasets", "2000",
                           "--database-url", database_url, "--work", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith(FORMATS)]
    assert [line.split()[0] for line in lines] == list(FORMATS) and all(" rows=2000 " in line for line in lines)


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_standard_output_takes_csv_and_json_lines_for_a_pipe(harvested, db, capsys, fmt):
    assert main(["export", "changes", "--format", fmt, "-o", "-"]) == 0
    captured = capsys.readouterr()
    (total,) = db.execute("SELECT count(*) FROM dataset_changes").fetchone()
    lines = captured.out.splitlines()
    assert len(lines) == total + (1 if fmt == "csv" else 0)
    if fmt == "jsonl":
        assert sorted(json.loads(line)["change_id"] for line in lines) == [
            r[0] for r in db.execute("SELECT id FROM dataset_changes ORDER BY id")]
    assert f"exported {total} changes to standard output" in captured.err
    assert main(["export", "datasets", "--format", "parquet", "-o", "-"]) == 2
    assert "Parquet is not written to standard output" in capsys.readouterr().err


def test_without_format_a_pipe_gets_csv_and_a_directory_parquet(harvested, db, capsys, tmp_path):
    """`harvester export datasets -o - | head`, as a newcomer types it: no --format needed."""
    assert main(["export", "datasets", "-o", "-"]) == 0
    captured = capsys.readouterr()
    (live,) = db.execute("SELECT count(*) FROM datasets WHERE removed_at IS NULL").fetchone()
    rows = list(csv.reader(io.StringIO(captured.out)))
    assert rows[0][:2] == ["dataset_id", "portal_name"] and len(rows) == live + 1
    assert main(["export", "datasets", "-o", str(tmp_path / "d")]) == 0
    assert [p.name for p in sorted((tmp_path / "d").iterdir())] == ["datasets.parquet", "manifest.json"]


@pytest.mark.parametrize("what", ["changes", "datasets"])
def test_a_pipe_closed_early_ends_the_export_quietly(harvested, what):
    """`harvester export changes --format csv -o - | head -3`, as the export docs pipe it: when the
    reader goes away, the export stops with a Unix tool's status (128 + SIGPIPE), no traceback."""
    import signal

    script = Path(sys.executable).parent / "harvester"
    proc = subprocess.Popen([str(script), "export", what, "--format", "csv", "-o", "-"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # the reader is gone before the first row
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGPIPE, err.decode()
    assert b"Traceback" not in err and b"BrokenPipeError" not in err, err.decode()


def test_the_docs_list_every_column_with_its_type():
    from harvester.store import export as store

    page = (ROOT / "docs" / "export.md").read_text(encoding="utf-8")
    for column in (*store.dataset_columns(raw=True), *store.CHANGE_COLUMNS):
        assert f"| `{column.name}` | {column.type} |" in page, f"docs/export.md lacks the column {column.name}"


def test_one_snapshot_holds_the_rows_and_the_runs(harvested, database_url, db):
    """Rows committed by another session after the export's first read are not in it."""
    from harvester.store import db as store_db
    from harvester.store import export as store

    with store_db.prepare(store_db.connect_url(database_url)) as conn, store.snapshot(conn):
        assert conn.execute("SELECT current_setting('transaction_isolation'), current_setting('transaction_read_only')"
                            ).fetchone() == ("repeatable read", "on")
        runs = store.committed_runs(conn)
        db.execute("UPDATE sync_runs SET finished_at = now() + interval '1 hour' WHERE run_id = 1")
        db.execute("UPDATE datasets SET removed_at = now() WHERE removed_at IS NULL")
        rows = [row for batch in store.dataset_batches(conn, batch_rows=3) for row in batch]
        assert store.committed_runs(conn) == runs and len(rows) == 7
    assert [r[0] for r in rows] == sorted(r[0] for r in rows)
