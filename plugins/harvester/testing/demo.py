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
import shutil
import subprocess
import sys
import time
from pathlib import Path

import requests

from harvester.config.settings import SettingError, env_value

ROOT = Path(__file__).resolve().parents[3]
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


def start_portal(port: int, edits: Path | None = None) -> tuple[subprocess.Popen, str]:
    """The demo portal; ``edits``: a JSONL file of changed records served instead of the samples'
    (later ids replace earlier ones)."""
    files = sample_files() + ([edits] if edits is not None and edits.exists() else [])
    args = [sys.executable, "-m", "harvester.testing.ckan_portal", "--port", str(port)]
    for f in files:
        args += ["--data", str(f)]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"demo: the demo portal exited with status {proc.returncode} (is port {port} in use? "
                     "set HARVESTER_DEMO_PORT)")
        try:
            if requests.get(f"{url}/api/3/action/status_show", timeout=2).ok:
                return proc, url
        except requests.RequestException:
            time.sleep(0.2)
    proc.kill()
    sys.exit(f"demo: the demo portal did not answer on {url}")


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
        # first demo of a checkout, reused by the next ones and by the CLI (the same default place).
        "HARVESTER_MODEL_CACHE": env.get("HARVESTER_MODEL_CACHE") or str(ROOT / ".harvester" / "models"),
        # The pool the demo creates below (unset, embed_changed would run in Airflow's default_pool).
        "HARVESTER_EMBEDDING_POOL": env.get("HARVESTER_EMBEDDING_POOL") or "embedding_api",
        "HF_HUB_OFFLINE": "1",
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
    })
    return env


def airflow(env: dict, *args: str, quiet: bool = False) -> None:
    cmd = [str(Path(sys.executable).parent / "airflow"), *args]
    out = subprocess.DEVNULL if quiet else None
    result = subprocess.run(cmd, env=env, stdout=out, stderr=subprocess.STDOUT if quiet else None)
    if result.returncode != 0:
        sys.exit(f"demo: `airflow {' '.join(args)}` failed with exit status {result.returncode}")


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
            portal, _ = start_portal(port)
        say("no runs yet: harvest_demo as a full sync first (airflow dags test harvest_demo -c '{\"full_sync\": true}')")
        airflow(env, "dags", "test", "harvest_demo", "-c", json.dumps({"full_sync": True}))
    if review == 0:
        count = write_edits(edits)
        say(f"{count} datasets edited on the demo portal ({edits}): harvest_demo again, incremental")
        stop_portal(portal)
        portal, _ = start_portal(port, edits)
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
        home = env_value("HARVESTER_DEMO_HOME") or ROOT / ".harvester" / "demo"
        port = env_value("HARVESTER_DEMO_PORT")
    except SettingError as exc:
        sys.exit(f"demo: {exc}")
    from harvester.store.embedded.server import EmbeddedServer

    server = EmbeddedServer(home / "db")
    if not args.keep and not args.standalone:
        if (home / "db" / "pgdata").exists():
            server.stop()
        shutil.rmtree(home, ignore_errors=True)
    say(f"starting the embedded PostgreSQL + pgvector ({home / 'db'})")
    db_url = server.start()
    say(f"serving {len(DEMO_FILES)} real CKAN sample files as a CKAN portal on 127.0.0.1:{port}")
    portal, portal_url = start_portal(port, home / "portal-edits.jsonl" if args.standalone else None)
    env = environment(home, db_url, portal_url)
    try:
        say("preparing the Airflow metadata database")
        airflow(env, "db", "migrate", quiet=True)
        airflow(env, "pools", "set", env["HARVESTER_EMBEDDING_POOL"], "2",
                "Embedding provider calls across all harvest DAGs", quiet=True)
        if args.standalone:
            portal = seed_for_standalone(env, home, db_url, port, portal)
            say("starting Airflow standalone on http://localhost:8080 (Ctrl-C to stop); "
                "the admin password is printed below and saved in " + str(home / "airflow"))
            subprocess.run([str(Path(sys.executable).parent / "airflow"), "standalone"], env=env)
            return 0
        say("run 1: harvest_demo as a full sync (airflow dags test harvest_demo -c '{\"full_sync\": true}')")
        airflow(env, "dags", "test", "harvest_demo", "-c", json.dumps({"full_sync": True}))
        say("run 2: harvest_demo again, incremental (nothing changed on the portal)")
        airflow(env, "dags", "test", "harvest_demo")
        say("both runs (harvester runs -p demo)")
        harvester(env, "runs", "-p", "demo", "--limit", "2")
        say("the records run 1 took with warnings, by reason (harvester report 1)")
        harvester(env, "report", "1")
        say("a few of the datasets (harvester datasets -p demo --limit 8)")
        harvester(env, "datasets", "-p", "demo", "--limit", "8")
        say("hybrid search, full text and vectors (harvester search \"council purchase card spending\" -p demo --limit 5)")
        harvester(env, "search", "council purchase card spending", "-p", "demo", "--limit", "5")
        say(f"done. The demo's data stays in {home} (`make airflow` opens it in the Airflow UI).")
    finally:
        stop_portal(portal)
        if not args.standalone:
            server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
