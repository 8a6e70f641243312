"""Which database the CLI uses with nothing configured, how it finds a portal by name, and the demo's
port (issue 38, findings 1 and 2). tests/cli/test_newcomer.py runs the whole path from a fresh clone."""
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from harvester.cli.main import main

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def nothing_configured(monkeypatch, tmp_path):
    monkeypatch.delenv("HARVESTER_DATABASE_URL", raising=False)
    monkeypatch.delenv("AIRFLOW_CONN_HARVESTER_DB", raising=False)
    monkeypatch.delenv("HARVESTER_EMBEDDED_DB", raising=False)
    home = tmp_path / "home"
    monkeypatch.setenv("HARVESTER_HOME", str(home))
    return home


def test_a_cli_that_finds_no_database_says_where_it_looked_and_starts_none(nothing_configured, capsys):
    assert main(["runs"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err == (
        "harvester: error: no database: neither HARVESTER_DATABASE_URL nor AIRFLOW_CONN_HARVESTER_DB is set, and there "
        f"is no embedded PostgreSQL in {nothing_configured / 'pgdata'}. Run `harvester db start` (a new, empty one) or "
        "`make demo`, or point the CLI at yours: HARVESTER_DATABASE_URL=postgresql://user:password@host:5432/"
        "harvester (or HARVESTER_HOME=the directory holding pgdata/)\n")
    assert not (nothing_configured / "pgdata").exists()  # no second, empty cluster behind the user's back


def test_without_harvester_home_the_cli_looks_in_the_checkout_then_in_the_demos(monkeypatch, tmp_path):
    from harvester.store.embedded.server import cli_homes

    monkeypatch.delenv("HARVESTER_HOME", raising=False)
    monkeypatch.setenv("HARVESTER_DEMO_HOME", str(tmp_path / "demo"))
    assert cli_homes() == [ROOT / ".harvester", tmp_path / "demo" / "db"]
    monkeypatch.delenv("HARVESTER_DEMO_HOME")
    assert cli_homes() == [ROOT / ".harvester", ROOT / ".harvester" / "demo" / "db"]


def test_the_cli_uses_an_embedded_server_that_holds_data_and_says_which(nothing_configured, pg_server, monkeypatch,
                                                                         capsys):
    monkeypatch.setenv("HARVESTER_HOME", str(pg_server.home))
    assert main(["runs", "--json"]) == 0
    assert capsys.readouterr().err == (f"harvester: using the embedded PostgreSQL in {pg_server.home}; set "
                                       "HARVESTER_DATABASE_URL for another database\n")


def _portals_file(tmp_path, monkeypatch, names):
    path = tmp_path / "portals.yaml"
    path.write_text(yaml.safe_dump({"portals": [{"name": n, "url": f"https://{n}.example"} for n in names]}))
    monkeypatch.setenv("HARVESTER_PORTALS_FILE", str(path))
    return path


def test_a_portal_named_only_by_its_runs_is_found_in_the_database(db, tmp_path, monkeypatch, capsys):
    """The demo's portal is in portals.demo.yaml, not portals.yaml: `-p demo` finds it by its runs'
    name, at the URL they recorded (the demo's port may not be the file's default)."""
    path = _portals_file(tmp_path, monkeypatch, ["canada", "demo_elsewhere"])
    db.execute("INSERT INTO sync_runs (portal_url, portal_name, mode, status, stats) VALUES "
               "('http://127.0.0.1:18765', 'demo', 'full', 'committed', '{\"fetched\": 897}'), "
               "('https://old.example', 'moved', 'full', 'committed', '{}')")
    assert main(["runs", "-p", "demo", "--json"]) == 0
    runs = __import__("json").loads(capsys.readouterr().out)
    assert [(r["portal"], r["stats"]["fetched"]) for r in runs] == [("demo", 897)]
    assert main(["changes", "-p", "demo"]) == 0
    assert capsys.readouterr().out.strip() == "no changes in demo"
    assert main(["export", "datasets", "--format", "csv", "-o", "-", "-p", "demo"]) == 0
    assert capsys.readouterr().err.strip() == "exported 0 datasets to standard output"

    # a harvest needs the portal's settings: the database's knowing it is said, with where to look
    assert main(["harvest", "demo"]) == 2
    assert capsys.readouterr().err == (
        f"harvester: error: no portal named 'demo' in {path}; known portals: canada, demo_elsewhere; the harvester "
        "database knows demo (http://127.0.0.1:18765) from its runs, but a harvest needs the portal's settings: add "
        "it to that file, or set HARVESTER_PORTALS_FILE to the file it came from (the demo's: "
        "dags/portals.demo.yaml)\n")

    # portals.yaml first: its entry wins over a run's name
    _portals_file(tmp_path, monkeypatch, ["demo"])
    assert main(["runs", "-p", "demo", "--json"]) == 0
    assert __import__("json").loads(capsys.readouterr().out) == []

    # in neither: both places named, with what each knows
    _portals_file(tmp_path, monkeypatch, ["canada", "demo_elsewhere"])
    assert main(["changes", "-p", "nope"]) == 2
    assert capsys.readouterr().err == (
        f"harvester: error: no portal named 'nope' in {path} (known there: canada, demo_elsewhere) or in the "
        "database's runs (known there: demo, moved); set HARVESTER_PORTALS_FILE for another portals file\n")


# -- the demo's port ---------------------------------------------------------------------------
@pytest.fixture
def stranger():
    """Another program on a port: a CKAN portal of its own, which records what it is asked."""
    from harvester.testing.ckan_portal import DemoPortal

    other = DemoPortal(records=[{"id": f"stranger-{i}", "name": f"stranger-{i}", "title": f"Not the demo's {i}",
                                 "metadata_modified": "2024-01-01T00:00:00"} for i in range(5)])
    other.start()
    yield other
    other.stop()


def demo_env(home: Path, port: int) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HARVESTER_", "AIRFLOW_"))}
    env.update({"HARVESTER_DEMO_HOME": str(home), "HARVESTER_DEMO_PORT": str(port),
                "PYTHONPATH": str(ROOT / "plugins")})
    return env


def test_the_demo_stops_in_one_line_when_its_port_is_taken_and_harvests_nothing(stranger, tmp_path):
    port = int(stranger.base_url.rsplit(":", 1)[1])
    home = tmp_path / "demo"
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "harvester.testing.demo"], env=demo_env(home, port), cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:  # the code of e76bfa5 harvests from the stranger: its portal, Airflow
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail("the demo did not stop within 120s")
    finally:
        if (home / "db" / "pgdata").exists():  # what the code of e76bfa5 starts
            from harvester.store.embedded.server import EmbeddedServer

            with contextlib.suppress(Exception):
                EmbeddedServer(home / "db").stop()
    took = time.monotonic() - started
    print(f"the demo stopped after {took:.1f}s")
    assert proc.returncode == 1, out + err
    (line,) = err.splitlines()
    assert line.startswith(f"demo: 127.0.0.1:{port}, the demo portal's port, is taken by another program; nothing "
                           "was harvested. Set HARVESTER_DEMO_PORT to a free port (e.g. HARVESTER_DEMO_PORT="), line
    assert stranger.requests == []
    assert not home.exists()  # the previous demo's data untouched, no server started


def test_the_demo_refuses_a_server_that_is_not_its_portal(stranger):
    """Another server that took the port after the demo checked it answers the health check: the
    demo's nonce tells them apart."""
    from harvester.testing import demo

    port = int(stranger.base_url.rsplit(":", 1)[1])
    ours = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    with pytest.raises(SystemExit) as exited:
        demo.wait_for_portal(ours, stranger.base_url, "our-nonce", port, timeout=20)
    assert str(exited.value.code).startswith(f"demo: 127.0.0.1:{port}, the demo portal's port, is taken by another "
                                             "program; nothing was harvested.")
    assert ours.poll() is not None  # ours was stopped
    assert [action for action, _ in stranger.requests] == ["status_show"]


def test_the_demo_portal_answers_with_its_nonce_and_names_a_taken_port_in_one_line(stranger):
    port = int(stranger.base_url.rsplit(":", 1)[1])
    sample = ROOT.parent / "shared" / "ckan-samples" / "envidat-ch.jsonl"
    done = subprocess.run([sys.executable, "-m", "harvester.testing.ckan_portal", "--port", str(port), "--data",
                           str(sample), "--nonce", "x"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 3
    assert done.stderr == f"demo portal: cannot listen on 127.0.0.1:{port}: Address already in use\n"

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        free = sock.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "harvester.testing.ckan_portal", "--port", str(free), "--data",
                             str(sample), "--nonce", "n0nce"], stdout=subprocess.DEVNULL)
    try:
        from harvester.testing import demo

        demo.wait_for_portal(proc, f"http://127.0.0.1:{free}", "n0nce", free)  # returns: it is ours
    finally:
        demo.stop_portal(proc)
