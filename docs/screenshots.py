"""Take the docs' screenshots of the Harvester page again: docs/img/harvester-page.png (the demo
portal's page) and docs/img/harvester-changes.png (the review queue).

    .venv/bin/python docs/screenshots.py [OUTPUT_DIR]      # about a minute; needs Debian's chromium

The demo's set-up (harvester.testing.demo) in a temporary directory, on free ports: the embedded
PostgreSQL, the demo CKAN portal, harvest_demo as a full sync and again after a few datasets were
edited on the portal (so the review queue has changes), then a real `airflow api-server` with the
plugin. Debian's chromium, driven by Playwright as in tests/ui/test_ui_browser.py, signs in on
Airflow's login page and saves the pages. Nothing is left behind but the PNG files.
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = os.environ.get("HARVESTER_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
PAGES = (  # file name, path under the api-server, what shows the page is drawn
    ("harvester-page.png", "/harvester/portals/demo", '[data-test="runs-chart"]'),
    ("harvester-changes.png", "/harvester/changes", '[data-test="change-row"]'),
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def api_server(env: dict, home: Path, password: str) -> tuple[subprocess.Popen, str]:
    import requests

    port = free_port()
    (home / "passwords.json").write_text(json.dumps({"admin": password}))
    env = {**env,
           "AIRFLOW__CORE__AUTH_MANAGER":
               "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
           "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin",
           "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
           "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(home / "passwords.json"),
           "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_urlsafe(64),
           "AIRFLOW__API__SECRET_KEY": secrets.token_urlsafe(32),
           "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}"}
    with (home / "api-server.log").open("wb") as log:
        proc = subprocess.Popen([str(Path(sys.executable).parent / "airflow"), "api-server", "-H", "127.0.0.1",
                                 "-p", str(port), "-w", "1"], env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if requests.get(f"{url}/api/v2/monitor/health", timeout=2).ok:
                return proc, url
        except requests.RequestException:
            time.sleep(0.5)
    stop(proc)
    sys.exit(f"screenshots: airflow api-server did not answer on {url}; see {home / 'api-server.log'}")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)


def shoot(url: str, password: str, out: Path) -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True,
                                     args=["--no-sandbox", "--disable-dev-shm-usage"])
        page = browser.new_context(base_url=url, viewport={"width": 1400, "height": 900}).new_page()
        page.set_default_timeout(30_000)
        page.goto("/")
        page.wait_for_url(lambda u: "/auth/login" in u)
        page.get_by_label("Username").fill("admin")
        page.get_by_label("Password").fill(password)
        page.get_by_role("button", name="Sign in").click()
        page.wait_for_url(lambda u: "/auth/login" not in u)
        for name, path, ready in PAGES:
            page.goto(path)
            page.locator(ready).first.wait_for()
            page.wait_for_timeout(1000)  # the charts' transitions
            page.screenshot(path=str(out / name))
            print(f"saved {out / name}", flush=True)
        browser.close()


def main(argv: list[str]) -> int:
    out = Path(argv[0]) if argv else ROOT / "docs" / "img"
    out.mkdir(parents=True, exist_ok=True)
    home = Path(tempfile.mkdtemp(prefix="harvester-screenshots-"))
    os.environ["HARVESTER_DEMO_HOME"] = str(home)
    from harvester.store.embedded.server import EmbeddedServer
    from harvester.testing import demo

    server = EmbeddedServer(home / "db")
    db_url = server.start()
    port = free_port()
    portal, portal_url = demo.start_portal(port, home / "portal-edits.jsonl")
    env = demo.environment(home, db_url, portal_url)
    api = None
    try:
        demo.airflow(env, "db", "migrate", quiet=True)
        demo.airflow(env, "pools", "set", env["HARVESTER_EMBEDDING_POOL"], "2", "Embedding provider calls",
                     quiet=True)
        portal = demo.seed_for_standalone(env, home, db_url, port, portal)
        password = "docs-" + secrets.token_hex(8)
        api, url = api_server(env, home, password)
        shoot(url, password, out)
    finally:
        if api is not None:
            stop(api)
        demo.stop_portal(portal)
        server.stop()
        shutil.rmtree(home, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
