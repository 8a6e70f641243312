"""The harvester command, in-process (harvest, runs, datasets, portals) and as the installed script (db)."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

from harvester.cli.main import main

ROOT = Path(__file__).resolve().parents[2]


def configure(tmp_path, monkeypatch, url):
    path = tmp_path / "portals.yaml"
    path.write_text(yaml.safe_dump({"portals": [{"name": "clitest", "url": url, "politeness_delay": 0}]}))
    monkeypatch.setenv("HARVESTER_PORTALS_FILE", str(path))


def test_harvest_runs_and_datasets(database_url, portal_server, samples, tmp_path, monkeypatch, capsys):
    records = samples("data-gov-au.jsonl")
    portal_server.set_records(records)
    configure(tmp_path, monkeypatch, portal_server.base_url)

    assert main(["harvest", "clitest", "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["created"] == len(records) and stats["fetched"] == len(records)

    assert main(["runs", "-p", "clitest", "--json"]) == 0
    (run,) = json.loads(capsys.readouterr().out)
    assert (run["mode"], run["status"], run["stats"]["created"]) == ("full", "committed", len(records))

    assert main(["runs", "-p", "clitest"]) == 0
    out = capsys.readouterr().out
    assert "committed" in out and "embedding_requests" in out

    assert main(["datasets", "-p", "clitest", "--json", "--limit", "3"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert len(listed) == 3 and all(d["embedded"] for d in listed)
    assert {d["title"] for d in listed} <= {r["title"] for r in records}


def test_unknown_portal_is_named(database_url, tmp_path, monkeypatch, capsys):
    configure(tmp_path, monkeypatch, "https://example.org")
    assert main(["runs", "-p", "nope"]) == 2
    assert "no portal named 'nope'" in capsys.readouterr().err


def test_portals_lists_the_file(capsys):
    assert main(["portals", "--file", str(ROOT / "dags" / "portals.yaml"), "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert len(listed) >= 5 and {"canada", "humdata"} <= {p["name"] for p in listed}
    canada = next(p for p in listed if p["name"] == "canada")
    assert (canada["lookback"], canada["reconcile_every"], canada["full_sync_every"]) == ("2h", "1d", None)
    assert main(["portals", "--file", str(ROOT / "dags" / "portals.yaml")]) == 0
    assert "reconcile" in capsys.readouterr().out


def test_db_commands_manage_an_embedded_server(tmp_path):
    """The installed console script: db start, url, status, migrate, stop."""
    import tempfile

    script = Path(sys.executable).parent / "harvester"
    home = Path(tempfile.mkdtemp(prefix="harvester-cli-"))
    env = {k: v for k, v in os.environ.items() if k not in ("HARVESTER_DATABASE_URL", "AIRFLOW_CONN_HARVESTER_DB")}
    env["HARVESTER_HOME"] = str(home)

    def run(*args):
        return subprocess.run([str(script), *args], env=env, capture_output=True, text=True, timeout=120)

    never = run("db", "url")
    assert never.returncode == 2 and "has never been started: run `harvester db start`" in never.stderr
    started = run("db", "start")
    assert started.returncode == 0, started.stderr
    url = started.stdout.strip()
    assert url.startswith("postgresql://postgres@127.0.0.1:") and url.endswith("/harvester")
    try:
        assert run("db", "url").stdout.strip() == url
        assert "running at" in run("db", "status").stdout
        checked = run("db", "check")
        assert checked.returncode == 0, checked.stderr
        server, pending = checked.stdout.strip().splitlines()
        assert re.fullmatch(r"PostgreSQL 1[5-8]\S*( \(.*\))?, pgvector 0\.8\.\d+ on the server, 0\.8\.\d+ installed in"
                            r' database "harvester": supported \(Harvester supports PostgreSQL 15 to 18 with pgvector'
                            r" 0\.8\.0 or newer\)", server), server
        assert pending.startswith("pending migrations: 001_initial.sql, 002_") and pending.endswith(".sql")
        assert run("db", "migrate").stdout.strip().startswith("applied: 001_initial.sql, ")
        assert run("db", "migrate").stdout.strip() == "schema is up to date"
        assert run("db", "check").stdout.strip().splitlines()[1] == "schema is up to date"
    finally:
        assert run("db", "stop").stdout.strip() == "stopped"
    assert "not running" in run("db", "status").stdout


def test_harvest_reconcile_from_the_shell(database_url, portal_server, samples, tmp_path, monkeypatch, capsys):
    records = samples("data-gov-au.jsonl")
    portal_server.set_records(records)
    configure(tmp_path, monkeypatch, portal_server.base_url)
    assert main(["harvest", "clitest"]) == 0
    portal_server.remove_record(records[0]["id"])
    capsys.readouterr()

    assert main(["harvest", "clitest", "--reconcile", "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert (stats["reconcile_listed"], stats["reconcile_removed"], stats["removed"]) == (len(records) - 1, 1, 1)
    assert main(["runs", "-p", "clitest"]) == 0
    out = capsys.readouterr().out
    assert "reconcile_listed" in out and "portal_bytes" in out and "run 2 reconciled: reconcile was requested" in out
    assert main(["runs", "-p", "clitest", "--json"]) == 0
    assert [r["reconciled"] for r in json.loads(capsys.readouterr().out)] == [None, "reconcile was requested"]
