"""A newcomer's path (issue 38, findings 1 and 2): a fresh clone, `make demo` (first with its port
taken by another server, then on a free port), then the CLI with nothing set shows the demo's data.

Slow: the demo runs two harvests through `airflow dags test` (about two minutes) and exports the
local model into the clone's fresh cache. The clone runs with this venv's python and
PYTHONPATH=<clone>/plugins (`make demo` there, without installing a second venv); the
test checks that the clone's code is the code that runs. Times are printed, never asserted.
"""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
PYTHON = sys.executable


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def newcomer_env(clone: Path, **extra: str) -> dict:
    """A shell with no Harvester or Airflow setting at all."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("HARVESTER_", "AIRFLOW_", "_AIRFLOW", "MAKE")) and k != "MFLAGS"}  # nor a make of ours
    env.update({"PYTHONPATH": str(clone / "plugins"), **extra})
    return env


def timed(args, *, env, cwd, timeout, shell=False):
    """Runs ``args``; on a timeout its whole process group (the demo's portal, Airflow) is killed."""
    started = time.monotonic()
    proc = subprocess.Popen(args, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            shell=shell, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{args} did not end within {timeout}s: {out[-2000:]}{err[-2000:]}")
    return subprocess.CompletedProcess(args, proc.returncode, out, err), time.monotonic() - started


@pytest.fixture
def clone(tmp_path):
    """/work/main's HEAD cloned to tmp/x/repo, with tmp/x/shared -> the samples' ../shared."""
    base = tmp_path / "x"
    base.mkdir()
    repo = base / "repo"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(repo)], check=True, timeout=300)
    (base / "shared").symlink_to(ROOT.parent / "shared")
    yield repo
    from harvester.store.embedded.server import EmbeddedServer

    for home in (repo / ".harvester" / "demo" / "db", repo / ".harvester"):
        if (home / "pgdata" / "postmaster.pid").exists():
            EmbeddedServer(home).stop()


@pytest.fixture
def stranger():
    """Another program's HTTP server: a CKAN portal of its own, recording what it is asked."""
    from harvester.testing.ckan_portal import DemoPortal

    other = DemoPortal(records=[{"id": f"stranger-{i}", "name": f"stranger-{i}", "title": f"Not the demo's {i}",
                                 "metadata_modified": "2024-01-01T00:00:00"} for i in range(5)])
    other.start()
    yield other
    other.stop()


def test_a_newcomer_runs_the_demo_and_the_cli_shows_its_data(clone, stranger):
    env = newcomer_env(clone)
    which = subprocess.run([PYTHON, "-c", "import harvester; print(harvester.__file__)"], env=env, cwd=clone,
                           capture_output=True, text=True, check=True).stdout.strip()
    assert which == str(clone / "plugins" / "harvester" / "__init__.py")  # the clone's code runs
    # `make demo` itself, with this venv as the clone's (.venv linked, its install stamp taken as done:
    # `make -o` never reinstalls, which would point the venv's editable install at the clone)
    (clone / ".venv").symlink_to(Path(PYTHON).parents[1])
    demo = ["make", "--no-print-directory", "-o", ".venv/.installed", "demo"]

    # -- 1. the demo's port taken by another server: one line, at once, nothing harvested ----------
    taken = int(stranger.base_url.rsplit(":", 1)[1])
    done, took = timed(demo, env=newcomer_env(clone, HARVESTER_DEMO_PORT=str(taken)), cwd=clone, timeout=120)
    print(f"\nmake demo, its port {taken} taken: exit {done.returncode} after {took:.1f}s: {done.stderr.strip()}")
    assert done.returncode == 2, done.stdout[-3000:] + done.stderr[-3000:]  # make's status for a failed recipe
    line, *rest = done.stderr.splitlines()
    assert [re.sub(r"\[Makefile:\d+: ", "[", r) for r in rest] == ["make: *** [demo] Error 1"], done.stderr
    assert line.startswith(f"demo: 127.0.0.1:{taken}, the demo portal's port, is taken by another program; "
                           "nothing was harvested. Set HARVESTER_DEMO_PORT to a free port"), line
    assert stranger.requests == []
    assert not (clone / ".harvester" / "demo").exists()

    # -- 2. on a free port (not the default: other programs may hold 8765 here) ----------------------
    port = free_port()
    done, took = timed(demo, env=newcomer_env(clone, HARVESTER_DEMO_PORT=str(port)), cwd=clone, timeout=1200)
    lines = done.stdout.splitlines() + done.stderr.splitlines()
    print(f"make demo on port {port}: exit {done.returncode} after {took:.1f}s, {len(lines)} lines of output "
          f"({len(done.stdout.splitlines())} on stdout, {len(done.stderr.splitlines())} on stderr)")
    assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-5000:]
    assert "demo-airflow.log" in done.stdout
    assert f"http://127.0.0.1:{port}" in done.stdout  # harvester runs -p demo: the portal it served
    demo_db = clone / ".harvester" / "demo" / "db"
    assert (demo_db / "pgdata" / "PG_VERSION").exists()
    assert not (demo_db / "pgdata" / "postmaster.pid").exists()  # the demo stopped its server

    # -- 3. the CLI, nothing set: the demo's data, said where it comes from ------------------------------
    cli = [PYTHON, "-m", "harvester.cli.main"]
    said = f"harvester: using the embedded PostgreSQL in {demo_db}"
    times = {}

    def run(*args):
        done, took = timed([*cli, *args], env=env, cwd=clone, timeout=300)
        times[" ".join(args)] = took
        assert done.returncode == 0, f"harvester {' '.join(args)}: {done.stdout[-3000:]}{done.stderr[-3000:]}"
        assert said in done.stderr, done.stderr
        return done

    first = run("runs")
    assert first.stderr.startswith(f"{said} (started it; `harvester db stop` stops it)")  # it was stopped
    assert "run 1" in first.stdout and "run 2" in first.stdout and "committed" in first.stdout
    changes = run("changes", "-p", "demo")
    header = re.match(rf"(\d+) changes in demo \(http://127\.0\.0\.1:{port}\), newest first", changes.stdout)
    assert header and int(header.group(1)) == 20 and changes.stdout.count("] NEW") == 20, changes.stdout[:500]
    search = run("search", "water")
    assert search.stdout.count("\n") > 10 and "Search: 'water' (hybrid" in search.stdout, search.stdout
    hits = json.loads(run("search", "water", "--json").stdout)  # named as its runs name it, not by its URL
    assert hits and {hit["portal"] for hit in hits} == {"demo"}, hits[:2]
    report = run("report", "1")
    assert report.stdout.startswith(f"run 1 of demo (http://127.0.0.1:{port}): full, committed"), report.stdout[:500]
    export, times["export datasets -o - | head"] = timed(
        f"{PYTHON} -m harvester.cli.main export datasets -o - | head", shell=True, env=env, cwd=clone,
        timeout=300)
    rows = export.stdout.splitlines()
    assert export.returncode == 0 and len(rows) == 10, export.stdout + export.stderr
    assert "title" in rows[0].split(","), rows[0]
    assert sum(f"http://127.0.0.1:{port}" in row for row in rows[1:]) == 9
    for command, took in times.items():
        print(f"harvester {command}: {took:.1f}s")

    # -- 4. no second database behind the user's back ---------------------------------------------------
    state = clone / ".harvester"
    assert not (state / "pgdata").exists() and not (state / "port").exists()
    assert sorted(p.name for p in state.iterdir()) == ["demo", "models"]
