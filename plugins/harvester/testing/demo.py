"""`make demo` and `make airflow`: Harvester on one machine, no services, no keys, no internet.

The demo starts the embedded PostgreSQL, serves real CKAN records from ../shared/ckan-samples as a
local CKAN portal on 127.0.0.1, runs harvest_demo twice through `airflow dags test` (a full sync,
then an incremental one), and prints both runs' stats and a few datasets. ``--standalone`` starts
the Airflow UI (`airflow standalone`) on the same set-up instead; when the demo database has no
runs yet it first harvests the demo portal (a full sync), and when no change needs review yet it
edits a few of the portal's datasets and harvests again, so the Harvester page has runs, changes
and a review queue to show.
"""
from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import requests

from harvester.config.settings import SettingError, env_value

ROOT = Path(__file__).resolve().parents[3]
PORTAL_LOG = "demo-portal.log"  # the demo portal's standard error, in the demo's home
# How many lines of Airflow's log the demo shows when an Airflow command fails.
LOG_TAIL = 40
SAMPLES = env_value("HARVESTER_SAMPLES_DIR") or ROOT.parent / "shared" / "ckan-samples"
# A varied catalogue: Portuguese with HTML, German, bilingual, harvested records, DKAN timestamps.
DEMO_FILES = (
    "dados-gov-br.jsonl", "data-humdata-org.jsonl", "data-birmingham-gov-uk.jsonl", "data-gov-uk.jsonl",
    "data-gov-au.jsonl", "data-stadt-zuerich-ch.jsonl", "envidat-ch.jsonl", "govdata-de.jsonl",
    "dkan-hauts-de-france.jsonl",
)


def say(text: str) -> None:
    print(f"\n==> {text}", flush=True)


def sample_files() -> list[Path]:
    files = [SAMPLES / name for name in DEMO_FILES]
    missing = [str(f) for f in files if not f.exists()]
    if missing:
        sys.exit(f"demo: sample files not found: {', '.join(missing)} (set HARVESTER_SAMPLES_DIR)")
    return files


def embedded_texts() -> list[str]:
    """The distinct texts the demo's first run embeds (title + description, as the pipeline builds
    them), in the order of the sample files."""
    from harvester.domain import dataset as ds
    from harvester.testing.ckan_portal import load_jsonl

    seen: dict[str, str] = {}
    for path in sample_files():
        for pkg in load_jsonl(path):
            rec = ds.normalize(pkg, "http://127.0.0.1/demo")
            if rec.ok:
                text = ds.embedding_text(rec.title, rec.description)
                seen.setdefault(ds.content_hash(text), text)
    return list(seen.values())


def port_taken(port: int) -> bool:
    """True when another program listens on 127.0.0.1:``port`` (bound as the demo portal binds it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def port_busy(port: int) -> str:
    """The one line the demo stops with when its port is another program's."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        free = sock.getsockname()[1]
    return (f"demo: 127.0.0.1:{port}, the demo portal's port, is taken by another program; nothing was harvested. "
            f"Set HARVESTER_DEMO_PORT to a free port (e.g. HARVESTER_DEMO_PORT={free} make demo)")


def start_portal(port: int, edits: Path | None = None, log: Path | None = None) -> tuple[subprocess.Popen, str]:
    """The demo portal; ``edits``: a JSONL file of changed records served instead of the samples'
    (later ids replace earlier ones); ``log``: where its standard error goes. Exits with one line when
    the port is taken, or when what answers on it is not the portal started here (its nonce)."""
    if port_taken(port):
        sys.exit(port_busy(port))
    files = sample_files() + ([edits] if edits is not None and edits.exists() else [])
    nonce = secrets.token_hex(16)
    args = [sys.executable, "-m", "harvester.testing.ckan_portal", "--port", str(port), "--nonce", nonce]
    for f in files:
        args += ["--data", str(f)]
    stderr = log.open("a", encoding="utf-8") if log is not None else None
    try:
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=stderr)
    finally:
        if stderr is not None:
            stderr.close()
    url = f"http://127.0.0.1:{port}"
    wait_for_portal(proc, url, nonce, port)
    return proc, url


def wait_for_portal(proc: subprocess.Popen, url: str, nonce: str, port: int, timeout: float = 30) -> None:
    """Until the portal ``proc`` answers on ``url`` with its ``nonce``; exits with one line when it
    exits first, when another server answers instead, or after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(port_busy(port) if port_taken(port) else
                     f"demo: the demo portal exited with status {proc.returncode} before it answered on {url}")
        try:
            answer = requests.get(f"{url}/api/3/action/status_show", timeout=2)
        except requests.RequestException:
            time.sleep(0.2)
            continue
        try:
            theirs = (answer.json().get("result") or {}).get("demo_portal_nonce")
        except (ValueError, AttributeError):
            theirs = None
        if theirs == nonce:
            return
        stop_portal(proc)
        sys.exit(port_busy(port))  # another server answered: it was there first
    stop_portal(proc)
    sys.exit(f"demo: the demo portal did not answer on {url} within {timeout:g}s")


def model_cache() -> Path:
    """The local model's ONNX cache the CLI uses in this environment (embeddings/onnx.py cache_root)."""
    from harvester.embeddings.onnx import cache_root

    return cache_root()


def environment(home: Path, db_url: str, portal_url: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update({
        "AIRFLOW_HOME": str(home / "airflow"),
        "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(ROOT / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW_CONN_HARVESTER_DB": db_url,
        "HARVESTER_DATABASE_URL": db_url,
        "HARVESTER_PORTALS_FILE": str(ROOT / "dags" / "portals.demo.yaml"),
        "HARVESTER_DEMO_PORTAL_URL": portal_url,
        "HARVESTER_HOME": str(home / "db"),
        # The local model's ONNX export outlives the demo's data (removed at each start): made by the
        # first demo of a checkout, reused by the next ones and by the CLI. The CLI's own cache, as this
        # environment sets it (HARVESTER_HOME below would move the default).
        "HARVESTER_MODEL_CACHE": str(model_cache()),
        # The pool the demo creates below (unset, embed_changed would run in Airflow's default_pool).
        "HARVESTER_EMBEDDING_POOL": env.get("HARVESTER_EMBEDDING_POOL") or "embedding_api",
        "HF_HUB_OFFLINE": "1",
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
    })
    return env


def airflow_log(env: dict) -> Path:
    """Where the demo writes Airflow's own output (hundreds of lines a run), not on the terminal."""
    return Path(env["AIRFLOW_HOME"]) / "demo-airflow.log"


def airflow(env: dict, *args: str) -> None:
    """``airflow ARGS``, its output appended to airflow_log(); on failure its tail is printed and the
    demo exits with one line naming the command and the log."""
    cmd = [str(Path(sys.executable).parent / "airflow"), *args]
    log = airflow_log(env)
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a", encoding="utf-8") as out:
        out.write(f"\n$ airflow {' '.join(args)}\n")
        out.flush()
        result = subprocess.run(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
    if result.returncode != 0:
        lines = log.read_text(encoding="utf-8", errors="replace").splitlines()[-LOG_TAIL:]
        print(f"--- the last {len(lines)} lines of {log} ---", *lines, "---", sep="\n", file=sys.stderr, flush=True)
        sys.exit(f"demo: `airflow {' '.join(args)}` failed with exit status {result.returncode} (its output: {log})")


def last_run(db_url: str) -> str:
    """One line on the latest run of the demo portal: its status and what it did."""
    import psycopg

    with psycopg.connect(db_url) as conn:
        row = conn.execute("SELECT run_id, status, stats, finished_at - started_at FROM sync_runs "
                           "WHERE portal_name = 'demo' ORDER BY run_id DESC LIMIT 1").fetchone()
    if row is None:
        return "no run recorded"
    run_id, status, stats, took = row
    counts = ", ".join(f"{key} {stats.get(key, 0)}" for key in ("fetched", "created", "updated", "unchanged",
                                                                 "failed", "embedded", "embeddings_reused"))
    return f"run {run_id}: {status}" + (f" in {took.total_seconds():.1f}s" if took else "") + f": {counts}"


def harvester(env: dict, *args: str) -> None:
    subprocess.run([sys.executable, "-m", "harvester.cli.main", *args], env=env, check=True)


def stop_portal(portal: subprocess.Popen) -> None:
    portal.terminate()
    try:
        portal.wait(10)
    except subprocess.TimeoutExpired:
        portal.kill()
        portal.wait(5)


def harvested(db_url: str) -> tuple[int, int]:
    """How many runs of harvest_demo the demo database holds, and how many changes need review."""
    import psycopg

    with psycopg.connect(db_url) as conn:
        if conn.execute("SELECT to_regclass('sync_runs'), to_regclass('dataset_changes')").fetchone() != (
                "sync_runs", "dataset_changes"):
            return 0, 0
        runs = conn.execute("SELECT count(*) FROM sync_runs WHERE portal_name = 'demo'").fetchone()[0]
        review = conn.execute("SELECT count(*) FROM dataset_changes WHERE requires_review").fetchone()[0]
    return runs, review


# Datasets the demo edits on its portal before its second run for the Airflow UI: (sample file,
# index of the record in it, what changes). A new title with a rewritten description weighs 0.9
# (title 0.3 + description 0.4 + its length 0.2) and needs review (0.7); a new title alone weighs
# 0.3 and a new tag 0.0: recorded, not for review.
DEMO_EDITS = (
    ("data-birmingham-gov-uk.jsonl", 0, "rewritten"),
    ("data-gov-uk.jsonl", 0, "rewritten"),
    ("data-humdata-org.jsonl", 0, "rewritten"),
    ("data-gov-au.jsonl", 0, "retitled"),
    ("data-stadt-zuerich-ch.jsonl", 0, "retitled"),
    ("envidat-ch.jsonl", 0, "tagged"),
)


def write_edits(path: Path) -> int:
    """The edited records, modified now, as a JSONL file for the demo portal."""
    from datetime import datetime, timezone

    now = datetime.now(timezone.utc).replace(tzinfo=None).isoformat(timespec="microseconds")
    edited = []
    for name, index, how in DEMO_EDITS:
        with (SAMPLES / name).open(encoding="utf-8") as handle:
            record = [json.loads(line) for line in handle if line.strip()][index]
        record["metadata_modified"] = now
        if how in ("rewritten", "retitled"):
            record["title"] = f"{record.get('title') or record.get('name')} (revised {now[:10]})"
        if how == "rewritten":
            record["notes"] = ("Rewritten on the portal for the Harvester demo: this description replaces the "
                               "previous one, so the change needs review.")
        if how == "tagged":
            record["tags"] = [*(record.get("tags") or []), {"name": "harvester-demo"}]
        edited.append(record)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in edited), encoding="utf-8")
    return len(edited)


def seed_for_standalone(env: dict, home: Path, db_url: str, port: int, portal: subprocess.Popen) -> subprocess.Popen:
    """Runs and changes for the Harvester page: a full sync when the database has no runs, then,
    when no change needs review yet, a run after some datasets were edited on the portal. Returns
    the portal serving what was harvested last."""
    edits = home / "portal-edits.jsonl"
    runs, review = harvested(db_url)
    if runs == 0:
        if edits.exists():  # the first run harvests the samples as they are
            edits.unlink()
            stop_portal(portal)
            portal, _ = start_portal(port, log=home / PORTAL_LOG)
        say("no runs yet: harvest_demo as a full sync first (airflow dags test harvest_demo -c '{\"full_sync\": true}')")
        airflow(env, "dags", "test", "harvest_demo", "-c", json.dumps({"full_sync": True}))
    if review == 0:
        count = write_edits(edits)
        say(f"{count} datasets edited on the demo portal ({edits}): harvest_demo again, incremental")
        stop_portal(portal)
        portal, _ = start_portal(port, edits, log=home / PORTAL_LOG)
        airflow(env, "dags", "test", "harvest_demo")
    runs, review = harvested(db_url)
    say(f"the demo database holds {runs} runs of harvest_demo and {review} changes that need review")
    return portal


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="harvester-demo", description=__doc__)
    parser.add_argument("--standalone", action="store_true", help="start the Airflow UI instead of the two runs")
    parser.add_argument("--keep", action="store_true", help="keep the previous demo database")
    args = parser.parse_args(argv)

    try:
        port = env_value("HARVESTER_DEMO_PORT")
    except SettingError as exc:
        sys.exit(f"demo: {exc}")
    from harvester.store.embedded.server import EmbeddedServer, demo_home

    home = demo_home()
    sample_files()
    # Before anything else (the previous demo's data is removed below): another program on the
    # portal's port would answer the demo's runs.
    if port_taken(port):
        sys.exit(port_busy(port))
    server = EmbeddedServer(home / "db")
    if not args.keep and not args.standalone:
        if (home / "db" / "pgdata").exists():
            server.stop()
        shutil.rmtree(home, ignore_errors=True)
    say(f"starting the embedded PostgreSQL + pgvector ({home / 'db'})")
    db_url = server.start()
    say(f"serving {len(DEMO_FILES)} real CKAN sample files as a CKAN portal on 127.0.0.1:{port}")
    portal, portal_url = start_portal(port, home / "portal-edits.jsonl" if args.standalone else None,
                                      log=home / PORTAL_LOG)
    env = environment(home, db_url, portal_url)
    try:
        say(f"preparing the Airflow metadata database (Airflow's own output goes to {airflow_log(env)})")
        airflow(env, "db", "migrate")
        airflow(env, "pools", "set", env["HARVESTER_EMBEDDING_POOL"], "2",
                "Embedding provider calls across all harvest DAGs")
        if args.standalone:
            portal = seed_for_standalone(env, home, db_url, port, portal)
            say("starting Airflow standalone on http://localhost:8080 (Ctrl-C to stop); "
                "the admin password is printed below and saved in " + str(home / "airflow"))
            subprocess.run([str(Path(sys.executable).parent / "airflow"), "standalone"], env=env)
            return 0
        say("run 1: harvest_demo as a full sync (airflow dags test harvest_demo -c '{\"full_sync\": true}')")
        airflow(env, "dags", "test", "harvest_demo", "-c", json.dumps({"full_sync": True}))
        print(last_run(db_url), flush=True)
        say("run 2: harvest_demo again, incremental (nothing changed on the portal)")
        airflow(env, "dags", "test", "harvest_demo")
        print(last_run(db_url), flush=True)
        say("both runs (harvester runs -p demo)")
        harvester(env, "runs", "-p", "demo", "--limit", "2")
        say("the records run 1 took with warnings, by reason (harvester report 1)")
        harvester(env, "report", "1")
        say("a few of the datasets (harvester datasets -p demo --limit 8)")
        harvester(env, "datasets", "-p", "demo", "--limit", "8")
        say("hybrid search, full text and vectors (harvester search \"council purchase card spending\" -p demo --limit 5)")
        harvester(env, "search", "council purchase card spending", "-p", "demo", "--limit", "5")
        say(f"done. The demo's data stays in {home}: the harvester command finds it with nothing set (try "
            "`harvester changes -p demo`), `make airflow` opens it in the Airflow UI.")
    finally:
        stop_portal(portal)
        if not args.standalone:
            server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
