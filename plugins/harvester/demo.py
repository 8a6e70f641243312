"""`make demo` and `make airflow`: Harvester on one machine, no services, no keys, no internet.

The demo starts the embedded PostgreSQL, serves real CKAN records from ../shared/ckan-samples as a
local CKAN portal on 127.0.0.1, runs harvest_demo twice through `airflow dags test` (a full sync,
then an incremental one), and prints both runs' stats and a few datasets. ``--standalone`` starts
the Airflow UI (`airflow standalone`) on the same set-up instead.
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

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = Path(os.environ.get("HARVESTER_SAMPLES_DIR") or ROOT.parent / "shared" / "ckan-samples")
# A varied catalogue: Portuguese with HTML, German, bilingual, harvested records, DKAN timestamps.
DEMO_FILES = (
    "dados-gov-br.jsonl", "data-humdata-org.jsonl", "data-birmingham-gov-uk.jsonl", "data-gov-uk.jsonl",
    "data-gov-au.jsonl", "data-stadt-zuerich-ch.jsonl", "envidat-ch.jsonl", "govdata-de.jsonl",
    "dkan-hauts-de-france.jsonl",
)


def say(text: str) -> None:
    print(f"\n==> {text}", flush=True)


def start_portal(port: int) -> tuple[subprocess.Popen, str]:
    files = [SAMPLES / name for name in DEMO_FILES]
    missing = [str(f) for f in files if not f.exists()]
    if missing:
        sys.exit(f"demo: sample files not found: {', '.join(missing)} (set HARVESTER_SAMPLES_DIR)")
    args = [sys.executable, "-m", "harvester.demo_portal", "--port", str(port)]
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
    subprocess.run([sys.executable, "-m", "harvester.cli", *args], env=env, check=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="harvester-demo", description=__doc__)
    parser.add_argument("--standalone", action="store_true", help="start the Airflow UI instead of the two runs")
    parser.add_argument("--keep", action="store_true", help="keep the previous demo database")
    args = parser.parse_args(argv)

    home = Path(os.environ.get("HARVESTER_DEMO_HOME") or ROOT / ".harvester" / "demo")
    port = int(os.environ.get("HARVESTER_DEMO_PORT", "8765"))
    from .store.server import EmbeddedServer

    server = EmbeddedServer(home / "db")
    if not args.keep and not args.standalone:
        if (home / "db" / "pgdata").exists():
            server.stop()
        shutil.rmtree(home, ignore_errors=True)
    say(f"starting the embedded PostgreSQL + pgvector ({home / 'db'})")
    db_url = server.start()
    say(f"serving {len(DEMO_FILES)} real CKAN sample files as a CKAN portal on 127.0.0.1:{port}")
    portal, portal_url = start_portal(port)
    env = environment(home, db_url, portal_url)
    try:
        say("preparing the Airflow metadata database")
        airflow(env, "db", "migrate", quiet=True)
        airflow(env, "pools", "set", os.environ.get("HARVESTER_EMBEDDING_POOL", "embedding_api"), "2",
                "Embedding provider calls across all harvest DAGs", quiet=True)
        if args.standalone:
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
        say("a few of the datasets (harvester datasets -p demo --limit 8)")
        harvester(env, "datasets", "-p", "demo", "--limit", "8")
        say("semantic search over the vectors (harvester search \"council purchase card spending\" -p demo --limit 5)")
        harvester(env, "search", "council purchase card spending", "-p", "demo", "--limit", "5")
        say(f"done. The demo's data stays in {home} (`make airflow` opens it in the Airflow UI).")
    finally:
        portal.terminate()
        portal.wait(10)
        if not args.standalone:
            server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
