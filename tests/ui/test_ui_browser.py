"""The Harvester page in a real browser: headless Chromium (Debian's `chromium`, driven by
Playwright) against a real `airflow api-server` with this project's plugin, on a portal harvested
twice through real Airflow runs (the second run retitles datasets, so changes need review).

An admin logs in on Airflow's login page, opens Harvester from Airflow's navigation, sees the
portals table and the runs chart (with each run's errors and warnings), opens the first run's
report (the catalogue served records the harvester cannot take and records it takes with
warnings), filters it by severity and downloads it as CSV, opens a change's dataset and its diff,
marks a change reviewed and sees it leave the queue; a planted title, and a record name quoted in
a report's message, with markup render as text. A viewer sees no review button and gets 403 on
the review POST. A DCAT aggregator republishes a few of the portal's datasets (harvested outside
Airflow): search shows each of those once, "also on" the aggregator, with an "all copies" toggle,
and the copy's page shows its group. Every page visited is saved as a screenshot under
test-artifacts/ui/ (git ignored)."""
from __future__ import annotations

import copy
import csv
import html
import io
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from harvester.testing.samples import edited

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts" / "ui"
PORTAL = "test"
SAMPLE = "data-humdata-org.jsonl"
XSS_TITLE = "<script>window.__xss=1</script>Evil"
XSS_NOTES = '<img src=x onerror="window.__xss=2">'
XSS_NAME = '<img src=x onerror="window.__xss=3">no-id'  # quoted in the message of a record without an id
NOT_A_DATE = "2020-13-45T99:00:00"
USERS = {"admin": "admin-" + secrets.token_hex(6), "viewer": "viewer-" + secrets.token_hex(6)}
AGGREGATOR = "aggregator"
COPIED = slice(10, 13)  # the records the aggregator republishes (not retitled, not planted)


def find_chromium() -> str | None:
    """Debian's chromium (HARVESTER_CHROMIUM: another Chromium binary, or none to check the skip)."""
    configured = os.environ.get("HARVESTER_CHROMIUM")
    candidates = [configured] if configured else [shutil.which("chromium"), "/usr/bin/chromium"]
    return next((c for c in candidates if c and os.access(c, os.X_OK)), None)


CHROMIUM = find_chromium()
if CHROMIUM is None:
    pytest.skip("chromium is not installed: apt-get install -y chromium "
                "(the browser test needs Debian's chromium)", allow_module_level=True)
try:
    from playwright.sync_api import expect, sync_playwright
except ImportError:
    pytest.skip("playwright is not installed: pip install -r requirements-dev.txt "
                "(the browser test drives Debian's chromium with it)", allow_module_level=True)


# -- the api-server -------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ApiServer:
    """`airflow api-server` in a subprocess on the test session's Airflow home and metadata DB."""

    def __init__(self, workdir: Path, database_url: str, portals_file: Path):
        from airflow.configuration import conf

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = workdir / "api-server.log"
        passwords = workdir / "passwords.json"
        passwords.write_text(json.dumps(USERS))
        bin_dir = Path(sys.executable).parent
        self.cmd = [str(bin_dir / "airflow"), "api-server", "-H", "127.0.0.1", "-p", str(self.port), "-w", "1"]
        self.env = {
            **os.environ,
            "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
            # the same metadata DB as the dag.test() runs (the session's sqlite file)
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": conf.get("database", "sql_alchemy_conn"),
            "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
            "AIRFLOW__CORE__PLUGINS_FOLDER": str(ROOT / "plugins"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__AUTH_MANAGER":
                "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin,viewer:viewer",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
            "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_urlsafe(64),
            "AIRFLOW__API__SECRET_KEY": secrets.token_urlsafe(32),
            "AIRFLOW__API__BASE_URL": self.url,
            "AIRFLOW_CONN_HARVESTER_DB": database_url,
            "HARVESTER_DATABASE_URL": database_url,
            "HARVESTER_PORTALS_FILE": str(portals_file),
        }
        self.proc: subprocess.Popen | None = None

    def tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def start(self, timeout: float = 90) -> None:
        import requests

        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(self.cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"airflow api-server exited with status {self.proc.returncode}; "
                            f"its log ({self.log_path}) ends:\n{self.tail()}")
            try:
                if requests.get(f"{self.url}/api/v2/monitor/health", timeout=2).ok:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.5)
        self.stop()
        pytest.fail(f"airflow api-server did not answer on {self.url} within {timeout:.0f} s; "
                    f"its log ({self.log_path}) ends:\n{self.tail()}")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)   # its own session: uvicorn and its worker
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)
        except ProcessLookupError:
            pass


# -- the harvested portal ---------------------------------------------------------------------------

class Site:
    def __init__(self, server: ApiServer, database_url: str, records: list[dict], planted: dict):
        self.server, self.url, self.database_url = server, server.url, database_url
        self.records, self.planted = records, planted

    def query(self, sql: str, *params):
        import psycopg

        with psycopg.connect(self.database_url) as conn:
            return conn.execute(sql, params).fetchall()

    def pending(self) -> list[tuple]:
        """The review queue: (change id, source_id, title) of the changes that require review and
        have no review yet (before sql/006_review.sql: all that require review)."""
        reviews = self.query("SELECT 1 FROM information_schema.columns"
                             " WHERE table_name = 'dataset_changes' AND column_name = 'review_outcome'")
        return self.query(
            "SELECT c.id, d.source_id, d.title FROM dataset_changes c JOIN datasets d ON d.id = c.dataset_id"
            " WHERE c.requires_review" + (" AND c.review_outcome IS NULL" if reviews else "") + " ORDER BY c.id")


@pytest.fixture(scope="module")
def site(airflow_db, pg_server, template_db, samples, tmp_path_factory):
    """A portal harvested twice through real Airflow runs into its own database, and a real
    `airflow api-server` with the plugin on the same metadata DB and database."""
    import psycopg

    from harvester.testing.dagtest import Harvest
    from harvester.testing.ckan_portal import DemoPortal

    workdir = tmp_path_factory.mktemp("ui")
    name = f"ui_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_server.url("postgres"), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template_db}"')
    database_url = pg_server.url(name)
    mp = pytest.MonkeyPatch()
    portal = DemoPortal(records=[])
    portal.start()
    server = None
    try:
        mp.setenv("HARVESTER_DATABASE_URL", database_url)
        mp.setenv("AIRFLOW_CONN_HARVESTER_DB", database_url)
        records = samples(SAMPLE)
        planted = edited(records[-1], id=str(uuid.uuid4()), name="planted-markup",
                         title="A planted dataset", notes="Its title and description change to markup.")
        # what the report of the first run lists: two records it cannot take (errors), two it
        # takes with a warning
        records[20]["notes"] = ""
        records[21].update(license_id="", license_title="")
        no_id = copy.deepcopy(records[5])
        del no_id["id"]
        no_id.update(name=XSS_NAME, title="A record without an id")
        bad_date = copy.deepcopy(records[6])
        bad_date.update(id=str(uuid.uuid4()), name="bad-date", title="A record with a bad date",
                        metadata_modified=NOT_A_DATE)
        portal.set_records([no_id, bad_date, *records, planted])
        harvest = Harvest(workdir, mp, name=PORTAL)
        # a title change alone needs review, as in tests/test_history_dag.py
        portals_file = harvest.configure(portal.base_url, significance={"title": 0.5, "review_threshold": 0.5})
        harvest_an_aggregator(portals_file, database_url, portal.base_url, records[COPIED])
        run = harvest.run(full_sync=True)
        assert run.state == "success", harvest.task_states(run)
        for record in records[:3]:
            portal.upsert_record(edited(record, title=record["title"] + " (revised)"))
        # escaped on the portal, as CKAN sites serve text with markup: the harvester stores it
        # unescaped, so the title and description are the markup itself
        planted = edited(planted, title=html.escape(XSS_TITLE), notes=html.escape(XSS_NOTES))
        portal.upsert_record(planted)
        run = harvest.run()
        assert run.state == "success", harvest.task_states(run)

        server = ApiServer(workdir, database_url, portals_file)
        server.start()
        the_site = Site(server, database_url, records, planted)
        the_site.portal_url = portal.base_url
        pending = the_site.pending()
        assert len(pending) == 4 and XSS_TITLE in [title for _, _, title in pending], pending
        yield the_site
    finally:
        if server is not None:
            server.stop()
            if server.log_path.exists() and ARTIFACTS.is_dir():  # beside the screenshots, for CI
                shutil.copy(server.log_path, ARTIFACTS / "api-server.log")
        portal.stop()
        mp.undo()
        with psycopg.connect(pg_server.url("postgres"), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def harvest_an_aggregator(portals_file: Path, database_url: str, source_url: str, copied: list[dict]) -> None:
    """A DCAT aggregator republishing ``copied`` (testing/aggregator.py), added to portals.yaml and
    harvested once, outside Airflow, before the portal's own runs (whose first one groups them)."""
    import yaml

    from harvester.config.portals import load_portals
    from harvester.embeddings.local import LocalProvider
    from harvester.pipeline import steps as pipeline
    from harvester.store import db as store_db
    from harvester.testing import aggregator
    from harvester.testing.dcat_portal import DcatServer

    with DcatServer() as dcat:
        dcat.set_document("/catalog.ttl", aggregator.catalogue(copied, source_url), "text/turtle")
        document = yaml.safe_load(portals_file.read_text())
        document["portals"].append({"name": AGGREGATOR, "url": dcat.url("/catalog.ttl"), "type": "dcat-rdf",
                                    "schedule": None, "politeness_delay": 0, "max_retries": 0})
        portals_file.write_text(yaml.safe_dump(document))
        (agg,) = [p for p in load_portals(portals_file) if p.name == AGGREGATOR]
        with store_db.prepare(store_db.connect_url(database_url)) as conn, \
                store_db.prepare(store_db.connect_url(database_url)) as reader:
            stats = pipeline.harvest(conn, reader, agg, pipeline.source_for(agg), LocalProvider(), full_sync=True)
        assert stats["failed"] == 0 and stats["created"] == len(copied), stats


# -- the browser ------------------------------------------------------------------------------------
class Shots:
    """Screenshots of every page visited, numbered in visiting order, in test-artifacts/ui/."""

    def __init__(self):
        shutil.rmtree(ARTIFACTS, ignore_errors=True)
        ARTIFACTS.mkdir(parents=True)
        self.n = 0
        self.page = None

    def __call__(self, page, name: str) -> Path:
        self.page = page
        self.n += 1
        path = ARTIFACTS / f"{self.n:02d}-{name}.png"
        page.screenshot(path=str(path), full_page=True)
        return path

    def failure(self) -> None:
        """The page as it was when the test failed, if it is still open."""
        try:
            if self.page is not None and not self.page.is_closed():
                self(self.page, "failed")
        except Exception:  # noqa: BLE001  the failure itself is what matters
            pass


@pytest.fixture(scope="module")
def browser():
    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, headless=True,
                                      args=["--no-sandbox", "--disable-dev-shm-usage"])
        yield chromium
        chromium.close()


@pytest.fixture(scope="module")
def shots():
    return Shots()


def login(browser, site: Site, user: str, shots, width: int = 1400):
    context = browser.new_context(base_url=site.url, viewport={"width": width, "height": 1000})
    context.set_default_timeout(15_000)
    page = context.new_page()
    page.goto("/")
    page.wait_for_url(re.compile(r"/auth/login"))
    page.get_by_label("Username").fill(user)
    page.get_by_label("Password").fill(USERS[user])
    shots(page, f"{user}-login")
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(lambda url: "/auth/login" not in url)
    expect(page.get_by_role("link", name="Dags").or_(page.get_by_label("Dags")).first).to_be_visible()
    shots(page, f"{user}-airflow-home")
    return context, page


def open_harvester(page, shots, user: str):
    """Harvester from Airflow's navigation: a top-level entry (the plugin's nav_top_level), else
    under Airflow's Plugins menu; Airflow shows the external view in an iframe at
    /plugin/<url_route>."""
    entry = page.locator('[aria-label="Harvester"]')
    plugins_menu = page.locator('[aria-label="Plugins"]')
    expect(entry.or_(plugins_menu).first).to_be_visible()
    if not entry.first.is_visible():
        plugins_menu.first.click()
        entry = page.get_by_role("menuitem", name="Harvester")
    # Airflow's UI can take a click before its router handles it (a page just loaded on a busy
    # machine: seen once in a full suite, the click went nowhere for 15 s): click once more then.
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    for attempt in (1, 2):
        entry.first.click()
        try:
            page.wait_for_url(re.compile(r"/plugin/harvester$"))
            break
        except PlaywrightTimeout:
            if attempt == 2:
                raise
    frame = page.frame_locator('iframe[src*="harvester"]')
    expect(frame.locator('[data-test="portals-table"]')).to_be_visible()
    shots(page, f"{user}-harvester")
    return frame


def open_changes(frame):
    """The review queue, from the Harvester page's own navigation."""
    frame.locator('nav a[data-nav="changes"]').click()
    expect(frame.locator('[data-test="tab-queue"]')).to_have_attribute("aria-selected", "true")
    return frame.locator('[data-test="change-row"]')


def test_harvester_page_in_a_browser(shots, site, browser):
    try:
        queued = admin_reviews_a_change(site, browser, shots)
        viewer_cannot_review(site, browser, shots, queued)
        search_shows_a_dataset_once(site, browser, shots)
    except BaseException:
        shots.failure()
        raise


def admin_reviews_a_change(site, browser, shots) -> int:
    """Portals, a portal's runs, the review queue, a dataset's diff, a review; returns how many
    changes are left in the queue."""
    context, page = login(browser, site, "admin", shots)
    frame = open_harvester(page, shots, "admin")
    table = frame.locator('[data-test="portals-table"]')
    expect(table.locator('[data-test="portal-row"]')).to_have_count(2)  # the portal and the aggregator
    expect(frame.locator('[data-test="queue-count"]')).to_have_text("4")
    # the last run's status links to its report
    (last,) = site.query("SELECT max(run_id) FROM sync_runs WHERE portal_name = %s", PORTAL)[0]
    expect(table.locator(f'[data-test="portal-row"][data-portal="{PORTAL}"] [data-test="last-run-link"]')
           ).to_have_attribute("href", f"/harvester/runs/{last}")

    table.get_by_role("link", name=PORTAL, exact=True).click()
    chart = frame.locator('[data-test="runs-chart"]')
    expect(chart).to_be_visible()
    assert chart.evaluate("e => e.tagName.toLowerCase()") == "svg"
    expect(frame.locator('[data-test="run-row"]')).to_have_count(2)
    shots(page, "admin-portal-runs")
    read_the_first_runs_report(site, context, page, frame, shots)

    rows = open_changes(frame)
    queued = len(site.pending())
    expect(rows).to_have_count(queued)
    # the planted markup is shown as text, never run
    expect(rows.get_by_text(XSS_TITLE, exact=True)).to_be_visible()
    shots(page, "admin-review-queue")

    # a change's dataset and its diff
    revised = site.records[0]["title"] + " (revised)"
    rows.get_by_role("link", name=revised, exact=True).click()
    expect(frame.locator('[data-test="dataset-title"]')).to_have_text(revised)
    diff = frame.locator('[data-test="dataset-diff"]')
    expect(diff).to_be_visible()
    expect(diff.locator('tr[data-changed="true"]').filter(has_text="(revised)").first).to_be_visible()
    shots(page, "admin-dataset-diff")

    # the planted dataset's page: its title and description as text
    rows = open_changes(frame)
    rows.get_by_role("link", name=XSS_TITLE, exact=True).click()
    expect(frame.locator('[data-test="dataset-title"]')).to_have_text(XSS_TITLE)
    expect(frame.locator('[data-test="dataset-diff"]')).to_contain_text(XSS_NOTES)
    expect(frame.locator('img[src="x"]')).to_have_count(0)
    shots(page, "admin-planted-dataset")

    # mark a change reviewed: it leaves the queue
    rows = open_changes(frame)
    expect(rows).to_have_count(queued)
    row = rows.filter(has=frame.get_by_role("link", name=revised, exact=True))
    row.locator('[data-test="review-button"]').click()
    row.locator('[data-test="review-confirm"]').click()
    expect(rows).to_have_count(queued - 1)
    expect(rows.get_by_role("link", name=revised, exact=True)).to_have_count(0)
    assert len(site.pending()) == queued - 1
    assert site.query("SELECT d.title, c.review_outcome, c.reviewed_by FROM dataset_changes c"
                      " JOIN datasets d ON d.id = c.dataset_id WHERE c.review_outcome IS NOT NULL") == [
        (revised, "reviewed", "admin")]
    shots(page, "admin-reviewed")

    for target in page.frames:
        assert target.evaluate("() => window.__xss") is None, f"the planted markup ran in {target.url}"
    context.close()
    return queued - 1


def read_the_first_runs_report(site, context, page, frame, shots) -> None:
    """From the portal's page: the chart's errors and warnings per run, the first run's report
    grouped by reason (as the API counts it), filtered to errors, downloaded as CSV."""
    runs = site.query("SELECT run_id FROM sync_runs WHERE portal_name = %s ORDER BY run_id", PORTAL)  # not the aggregator's
    first = runs[0][0]

    def api(path, **params):
        response = context.request.get(f"{site.url}/harvester/api{path}", params=params)  # the page's own cookie
        assert response.ok, (path, response.status, response.text())
        return response.json()

    listed = {r["run_id"]: r for r in api("/portals/test/runs")["items"]}
    # the chart: a line of errors and one of warnings, a dot per run (oldest left)
    chart = frame.locator('[data-test="runs-chart"]')
    for series, key in (("record errors", "errors"), ("record warnings", "warnings")):
        dots = chart.locator(f'circle[data-series="{series}"]')
        expect(dots).to_have_count(len(runs))
        assert [int(v) for v in dots.evaluate_all("ds => ds.map(d => d.getAttribute('data-value'))")] == [
            listed[run_id][key] for (run_id,) in runs]
    run_row = frame.locator(f'[data-test="run-row"][data-run-id="{first}"]')
    expect(run_row.locator('[data-test="run-errors"]')).to_have_text(f"{listed[first]['errors']} errors")
    expect(run_row.locator('[data-test="run-warnings"]')).to_have_text(f"{listed[first]['warnings']} warnings")
    report = api(f"/runs/{first}/outcomes", limit=500)
    assert report["counts"]["errors"] == 2 and report["counts"]["warnings"] >= 2, report["counts"]
    stored = dict(site.query("SELECT code, count(*) FROM record_outcomes WHERE run_id = %s GROUP BY code", first))
    assert {g["code"]: g["count"] for g in report["groups"]} == stored

    frame.locator(f'[data-test="run-row"][data-run-id="{first}"] [data-test="run-report-link"]').click()
    expect(frame.locator('[data-test="run-title"]')).to_contain_text(f"Run {first}")
    groups = frame.locator('[data-test="outcome-group"]')
    expect(groups).to_have_count(len(report["groups"]))
    for group in report["groups"]:
        row = frame.locator(f'[data-test="outcome-group"][data-code="{group["code"]}"]')
        expect(row.locator('[data-test="group-count"]')).to_have_text(str(group["count"]))
        expect(row.locator('[data-test="group-message"]')).to_have_text(group["message"])
    expect(frame.locator('[data-test="outcome-row"]')).to_have_count(min(25, report["total"]))
    # the record's name, markup, quoted in a message: text, never markup
    expect(frame.locator('[data-test="outcome-group"][data-code="no-identifier"] [data-test="group-message"]')
           ).to_contain_text(XSS_NAME)
    expect(frame.locator('[data-test="row-message"]').filter(has_text=XSS_NAME)).to_have_count(1)
    expect(frame.locator('img[src="x"]')).to_have_count(0)
    shots(page, "admin-run-report")

    # errors only: the groups and rows re-queried
    frame.locator('[data-test="severity-error"]').click()
    expect(frame.locator('[data-test="severity-error"]')).to_have_attribute("aria-selected", "true")
    errors = [g for g in report["groups"] if g["severity"] == "error"]
    expect(groups).to_have_count(len(errors))
    expect(frame.locator('[data-test="outcome-group"][data-severity="warning"]')).to_have_count(0)
    expect(frame.locator('[data-test="outcome-row"]')).to_have_count(report["counts"]["errors"])
    expect(frame.locator('[data-test="outcome-row"][data-severity="warning"]')).to_have_count(0)
    shots(page, "admin-run-report-errors")

    # the download: the current filter's rows
    with page.expect_download() as info:
        frame.locator('[data-test="download-csv"]').click()
    download = info.value
    assert download.suggested_filename == f"harvester-run-{first}-outcomes.csv"
    saved = ARTIFACTS / download.suggested_filename
    download.save_as(str(saved))
    text = saved.read_text(encoding="utf-8")
    rows = list(csv.DictReader(io.StringIO(text)))
    assert len(text.splitlines()) == len(rows) + 1 == report["counts"]["errors"] + 1
    want = [r for r in report["items"] if r["severity"] == "error"]
    assert [(r["code"], r["source_id"], r["message"]) for r in rows] == [
        (r["code"], r["source_id"] or "", r["message"]) for r in want]

    # every severity again, then back to the portal by the crumbs
    frame.locator('[data-test="severity-all"]').click()
    expect(groups).to_have_count(len(report["groups"]))
    frame.locator(".crumbs a", has_text="test").click()
    expect(frame.locator('[data-test="runs-chart"]')).to_be_visible()


def viewer_cannot_review(site, browser, shots, queued: int) -> None:
    """No review button for a viewer, and 403 on the review POST."""
    context, page = login(browser, site, "viewer", shots)
    frame = open_harvester(page, shots, "viewer")
    rows = open_changes(frame)
    expect(rows).to_have_count(queued)
    expect(frame.locator('[data-test="review-button"]')).to_have_count(0)
    shots(page, "viewer-review-queue")
    change_id = site.pending()[0][0]
    response = context.request.post(f"{site.url}/harvester/api/changes/{change_id}/review",
                                    data={"action": "reviewed", "note": "a viewer tries"})
    assert response.status == 403, (response.status, response.text())
    assert response.json()["detail"].startswith("viewer may not edit any harvest DAG ("), response.text()
    assert len(site.pending()) == queued
    context.close()


def search_shows_a_dataset_once(site, browser, shots) -> None:
    """A dataset the aggregator republishes: one result, "also on" the aggregator with a link to
    its copy; "all copies" shows both; the copy's page shows the group, canonical first."""
    record = site.records[COPIED][0]
    context, page = login(browser, site, "viewer", shots)
    frame = open_harvester(page, shots, "viewer")
    frame.locator('nav a[data-nav="search"]').click()
    frame.locator('[data-test="search-box"]').fill(record["title"])
    frame.locator('[data-test="search-button"]').click()
    results = frame.locator('[data-test="search-result"]')
    mine = results.filter(has=frame.get_by_role("link", name=record["title"], exact=True))
    expect(mine).to_have_count(1)
    expect(mine.locator('[data-test="also-on"]')).to_have_text(f"also on: {AGGREGATOR}")
    shots(page, "viewer-search-also-on")
    frame.locator('[data-test="search-all-copies"]').check()
    expect(mine).to_have_count(2)
    shots(page, "viewer-search-all-copies")
    frame.locator('[data-test="search-all-copies"]').uncheck()
    expect(mine).to_have_count(1)
    mine.locator('[data-test="also-on"]').get_by_role("link", name=AGGREGATOR).click()
    members = frame.locator('[data-test="group-member"]')
    expect(members).to_have_count(2)
    expect(members.first).to_contain_text(PORTAL)
    expect(members.first.locator('[data-test="canonical"]')).to_be_visible()
    expect(frame.locator('[data-test="split-button"]')).to_have_count(0)  # a viewer may not split
    shots(page, "viewer-dataset-group")
    context.close()


# -- the runs table (issue 38, finding 4) ----------------------------------------------------------------
def test_the_runs_table_fits_at_1440_px_and_counts_texts_embedded(site, browser, shots):
    """In the Airflow UI 1440 px wide, the portal's runs table shows every column, Links the last,
    without scrolling; "Embedded / reused" is each run's texts embedded and vectors reused (not its
    requests to the provider), and its header says what it counts."""
    context, page = login(browser, site, "admin", shots, width=1440)
    try:
        frame = open_harvester(page, shots, "admin-1440")
        frame.locator('[data-test="portals-table"]').get_by_role("link", name=PORTAL, exact=True).click()
        expect(frame.locator('[data-test="run-row"]')).to_have_count(2)
        shots(page, "admin-1440-portal-runs")
        wrap = frame.locator('[data-test="runs-table"]').locator("xpath=..")
        sizes = wrap.evaluate("""w => ({scroll: w.scrollWidth, client: w.clientWidth,
            right: w.getBoundingClientRect().right,
            links: Math.max(...[...w.querySelectorAll('td.links, thead th:last-child')]
                                .map(c => c.getBoundingClientRect().right)),
            columns: [...w.querySelectorAll('thead th')].map(c => [c.textContent, Math.round(c.offsetWidth)])})""")
        assert sizes["scroll"] <= sizes["client"] and sizes["links"] <= sizes["right"], sizes
        header = frame.locator('[data-test="runs-table"] thead th', has_text="Embedded / reused")
        assert "texts" in (header.get_attribute("title") or ""), header.get_attribute("title")
        runs = site.query("SELECT run_id, (stats->>'embedded')::int, (stats->>'embeddings_reused')::int"
                          " FROM sync_runs WHERE portal_name = %s", PORTAL)
        assert any(embedded for _, embedded, _ in runs), runs
        for run_id, embedded, reused in runs:
            expect(frame.locator(f'[data-test="run-row"][data-run-id="{run_id}"] [data-test="run-embedded"]')
                   ).to_have_text(f"{embedded:,} / {reused:,}")
    except BaseException:
        shots.failure()
        raise
    finally:
        context.close()


# -- every page and every link, offline (issue 38, finding 4) ------------------------------------------
MIRROR = "mirror"
MIRRORED = slice(13, 16)  # the records a portal only the database knows republishes


@pytest.fixture(scope="module")
def mirror(site):
    """A portal only the database knows: a DCAT catalogue republishing a few of the portal's
    datasets, harvested by `harvester harvest` from a portals file of its own, so not in the
    api-server's portals.yaml. Its datasets are copies of the portal's ("copied by", "also on")
    and its changes are among All changes."""
    import yaml

    from harvester.cli.main import main
    from harvester.testing import aggregator
    from harvester.testing.dcat_portal import DcatServer

    mp = pytest.MonkeyPatch()
    try:
        with DcatServer() as dcat:
            dcat.set_document("/catalog.ttl", aggregator.catalogue(site.records[MIRRORED], site.portal_url,
                                                                  base="https://mirror.example"), "text/turtle")
            own = site.server.log_path.parent / "mirror-portals.yaml"
            own.write_text(yaml.safe_dump({"portals": [{
                "name": MIRROR, "url": dcat.url("/catalog.ttl"), "type": "dcat-rdf", "schedule": None,
                "politeness_delay": 0, "max_retries": 0}]}))
            mp.setenv("HARVESTER_PORTALS_FILE", str(own))
            mp.setenv("HARVESTER_DATABASE_URL", site.database_url)
            assert main(["harvest", MIRROR, "--full"]) == 0
    finally:
        mp.undo()
    assert site.query("SELECT count(*) FROM datasets d JOIN sync_runs r ON r.portal_url = d.portal_url"
                      " WHERE r.portal_name = %s", MIRROR)[0][0] == MIRRORED.stop - MIRRORED.start
    return MIRROR


class Crawl:
    """A browser context that fails nothing itself but records what went wrong: console errors,
    uncaught exceptions, answers of 400 or more, and every request to a host other than
    127.0.0.1 (aborted: the pages must work offline)."""

    def __init__(self, browser, site: Site, width: int = 1440):
        import requests

        token = requests.post(f"{site.url}/auth/token", json={"username": "admin", "password": USERS["admin"]},
                              timeout=30)
        assert token.status_code == 201, token.text
        self.site = site
        self.context = browser.new_context(base_url=site.url, viewport={"width": width, "height": 900})
        self.context.set_default_timeout(20_000)
        self.context.add_cookies([{"name": "_token", "value": token.json()["access_token"], "url": site.url}])
        self.offsite: list[str] = []
        self.problems: list[str] = []
        self.context.route("**/*", self._route)
        self.page = self.context.new_page()
        self.page.on("console", lambda m: m.type == "error" and self.problems.append(
            f"{self.page.url}: console error: {m.text}"))
        self.page.on("pageerror", lambda e: self.problems.append(f"{self.page.url}: uncaught: {e}"))
        self.page.on("response", lambda r: r.status >= 400 and self.problems.append(
            f"{self.page.url}: {r.request.method} {r.url} answered {r.status}"))

    def _route(self, route):
        from urllib.parse import urlsplit

        if urlsplit(route.request.url).hostname in ("127.0.0.1", None):
            route.continue_()
        else:
            self.offsite.append(route.request.url)
            route.abort()

    # a page is shown: its script marks #app data-rendered when done (or, without that mark, it
    # is no longer busy nor loading)
    RENDERED = """() => { const app = document.getElementById("app");
        return !!app && (app.hasAttribute("data-rendered") || (!app.hasAttribute("aria-busy")
               && app.textContent.trim() !== "" && !app.textContent.includes("Loading"))); }"""

    def open(self, path: str) -> None:
        """A Harvester page, shown."""
        from playwright.sync_api import TimeoutError as PlaywrightTimeout

        response = self.page.goto(path)
        if response is None or response.status != 200:
            self.problems.append(f"{path}: answered {response and response.status}")
        try:
            self.page.wait_for_function(self.RENDERED, timeout=20_000)
        except PlaywrightTimeout:
            self.problems.append(f"{path}: not shown within 20 s")
            return
        errors = self.page.locator('[data-test="error"]')
        if errors.count():
            self.problems.append(f"{path}: shows {errors.first.inner_text()!r}")

    def links(self) -> list[str]:
        return self.page.eval_on_selector_all("a[href]", "as => as.map(a => a.href)")


def test_every_page_and_link_works_offline(site, mirror, browser, shots):
    """Every Harvester page, and every same-origin link on it, followed: pages of a portal of
    portals.yaml and of one only the database knows (listed apart on the portals page), runs,
    datasets, changes, search, duplicates, the API docs. No 4xx/5xx, no console error, no request
    off 127.0.0.1."""
    from urllib.parse import quote_plus, urldefrag, urlsplit

    crawl = Crawl(browser, site)
    copied = quote_plus(site.records[MIRRORED][0]["title"])
    seeds = ["/harvester/", f"/harvester/portals/{PORTAL}", f"/harvester/portals/{MIRROR}",
             "/harvester/changes", "/harvester/changes?queue=false", f"/harvester/changes?queue=false&portal={MIRROR}",
             f"/harvester/search?q={copied}", f"/harvester/search?all_copies=true&q={copied}", "/harvester/docs",
             f"/harvester/dags/harvest_{PORTAL}"]  # the DAG's Harvester tab: its portal's page
    todo, seen, pages, other = list(seeds), set(seeds), [], []
    origin = site.url
    try:
        while todo:
            path = todo.pop(0)
            crawl.open(path)
            pages.append(path)
            assert len(pages) <= 400, "the crawl found more pages than it should: a link loop?"
            for href in crawl.links():
                url, _ = urldefrag(href)
                if not url.startswith(origin + "/"):
                    continue  # a portal's or a dataset's own page: not ours to follow
                target = url[len(origin):]
                if target in seen:
                    continue
                seen.add(target)
                parts = urlsplit(target)
                if parts.path.startswith("/harvester/") and not parts.path.startswith(("/harvester/api/",
                                                                                      "/harvester/openapi.json")):
                    todo.append(target)
                else:
                    other.append(target)  # Airflow's pages, a CSV download, the API description
        for target in other:
            response = crawl.context.request.get(origin + target)
            if response.status >= 400:
                crawl.problems.append(f"{target}: answered {response.status}")
    except BaseException:
        shots.failure()
        raise
    finally:
        print(f"crawled {len(pages)} pages:", *pages, f"and {len(other)} other links:", *other, sep="\n  ")

    assert crawl.problems == [] and crawl.offsite == []
    visited = set(pages)
    assert {f"/harvester/portals/{MIRROR}", "/harvester/docs"} <= visited
    # every page of the navigation, reached by its link (the Validate form among them)
    assert {"/harvester/", "/harvester/changes", "/harvester/search", "/harvester/validate"} <= visited, visited
    assert any(p.startswith("/harvester/api/export/") for p in other), other  # the lists' downloads
    assert any(p.startswith("/harvester/runs/") for p in visited)
    assert any(p.startswith(f"/harvester/datasets/{MIRROR}/") for p in visited)
    assert any(p.startswith(f"/harvester/datasets/{AGGREGATOR}/") for p in visited)
    assert any(p.startswith("/dags/") for p in other)  # Airflow's pages of the DAG runs
    assert any(p.startswith("/harvester/api/runs/") and ".csv" in p for p in other)  # a report's download

    # the portal only the database knows: the portals list shows it apart, marked, linking to its
    # page, which says so, with its run, and no DAG to run; the API docs render
    crawl.open("/harvester/")
    unlisted = crawl.page.locator('[data-test="unlisted-portals-table"] [data-test="portal-row"]')
    expect(unlisted).to_have_count(1)
    expect(unlisted.first).to_have_attribute("data-portal", MIRROR)
    expect(unlisted.first.locator('[data-test="not-configured"]')).to_have_text("not in portals.yaml")
    expect(crawl.page.locator('[data-test="portals-table"] [data-test="portal-row"]')).to_have_count(2)
    shots(crawl.page, "crawl-portals-with-database-only")
    unlisted.first.get_by_role("link", name=MIRROR, exact=True).click()
    crawl.page.wait_for_url(f"**/harvester/portals/{MIRROR}")
    expect(crawl.page.locator('[data-test="not-configured"]')).to_contain_text("Not in portals.yaml")
    expect(crawl.page.locator('[data-test="run-row"]')).to_have_count(1)
    expect(crawl.page.locator('[data-test="trigger-problem"]')).to_contain_text("not in portals.yaml: no DAG to run")
    expect(crawl.page.locator('[data-test="trigger-run"]')).to_have_count(0)
    shots(crawl.page, "crawl-database-only-portal")
    crawl.open(f"/harvester/portals/{PORTAL}")
    expect(crawl.page.locator('[data-test="copied-by"]').get_by_role("link", name=MIRROR)).to_have_count(1)
    crawl.open("/harvester/docs")
    expect(crawl.page.locator('[data-test="api-operation"][data-path="/api/search"]')).to_have_count(1)
    shots(crawl.page, "crawl-api-docs")

    # a search's snippet: the matching words marked, the description's own markdown
    # ("**ALL DATA EXCEPT ... CC-BY 4.0**") neither shown nor marked
    record = site.records[3]
    assert "**ALL DATA EXCEPT" in record["notes"]
    crawl.open("/harvester/search?q=" + quote_plus("OpenStreetMap extracts licensed"))
    result = crawl.page.locator('[data-test="search-result"]').filter(
        has=crawl.page.get_by_role("link", name=record["title"], exact=True))
    snippet = result.locator('[data-test="snippet"]')
    expect(snippet).to_have_count(1)
    marks = [m.lower() for m in snippet.locator("mark").all_inner_texts()]
    assert marks and all(w[:4] in ("open", "extr", "lice") for m in marks for w in m.split()), marks
    assert "*" not in snippet.inner_text(), snippet.inner_text()
    shots(crawl.page, "crawl-search-snippet")
    assert crawl.problems == [] and crawl.offsite == []
    crawl.context.close()
