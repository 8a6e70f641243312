"""What an operator does from the Harvester page besides reading (issue 38, finding 8), in a real
browser: headless Chromium (Debian's `chromium`, driven by Playwright) against a real `airflow
api-server` with the plugin, over the portal tests/ui/test_ui_browser.py harvests (its fixtures,
reused: the api-server and the harvests are the slow part).

An admin validates an uploaded catalogue and sees its grouped report; searches with a tag filter
that stays in the address bar (a filtered search is a link) and downloads the datasets the filters
keep; selects every change the review queue shows and marks them reviewed with one click; and on
the portal's page is told its DAG is paused, then (unpaused through Airflow's own API) starts a full
sync: a DAG run with the param full_sync, in Airflow's metadata database, linked to Airflow's grid."""
from __future__ import annotations

import csv
import importlib.util
import io
import json
import re
from collections import Counter
from pathlib import Path
from urllib.parse import quote

from harvester.testing.samples import dcat_samples_dir

_spec = importlib.util.spec_from_file_location("harvester_ui_browser_fixtures",
                                               Path(__file__).with_name("test_ui_browser.py"))
_browser = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_browser)  # skips this module too without chromium or playwright
_browser.ARTIFACTS = _browser.ARTIFACTS / "actions"  # this module's screenshots beside, not over, its own
site, browser, shots = _browser.site, _browser.browser, _browser.shots  # its module-scoped fixtures
expect = _browser.expect
PORTAL = _browser.PORTAL
CATALOGUE = dcat_samples_dir() / "dcat-us" / "dcatus3_0.json"  # 4 datasets, 1 failed, 3 with warnings


def act(site, browser, shots, step, *args) -> None:
    """One step as a signed-in admin, with a screenshot of the page if it fails."""
    context, page = _browser.login(browser, site, "admin", shots)
    try:
        step(site, context, page, shots, *args)
    except BaseException:
        shots.failure()
        raise
    finally:
        context.close()


def test_a_catalogue_is_validated_from_the_page(site, browser, shots, tmp_path):
    act(site, browser, shots, validate_an_upload, tmp_path)


def test_search_filters_are_in_the_address_bar_and_download(site, browser, shots):
    act(site, browser, shots, search_with_filters)


def test_every_change_shown_is_reviewed_with_one_click(site, browser, shots):
    act(site, browser, shots, review_every_change_shown)


def test_a_full_sync_is_started_from_the_portals_page(site, browser, shots):
    act(site, browser, shots, run_a_full_sync_now)


def validate_an_upload(site, context, page, shots, tmp_path) -> None:
    page.goto("/harvester/")
    page.locator('nav a[data-nav="validate"]').click()
    expect(page.locator('[data-test="validate-form"]')).to_be_visible()
    # a URL that is not http(s): the API's one-line error, shown
    page.locator('[data-test="validate-url"]').fill("ftp://example.org/data.json")
    page.locator('[data-test="validate-button"]').click()
    expect(page.locator('[data-test="validate-result"] [data-test="error"]')).to_contain_text("url")
    page.locator('[data-test="validate-url"]').fill("")
    upload = tmp_path / "data.json"
    upload.write_bytes(CATALOGUE.read_bytes())
    page.locator('[data-test="validate-file"]').set_input_files(str(upload))
    page.locator('[data-test="validate-button"]').click()
    report = page.locator('[data-test="validate-report"]')
    expect(report).to_be_visible(timeout=60_000)
    expect(report.locator('[data-test="validate-summary"]')).to_contain_text("4 records read")
    expect(report.locator('[data-test="validate-summary"]')).to_contain_text("1 cannot be taken")
    expect(report.locator('[data-test="validate-summary"]')).to_contain_text("3 taken with warnings")
    expect(report.locator('[data-test="validate-group"]').first).to_be_visible()
    shots(page, "admin-validate-upload")


def search_with_filters(site, context, page, shots) -> None:
    """A tag that a few datasets have: the search keeps only those, the address bar holds the
    filter (opening it again gives the same page), and the download holds every one of them."""
    counts = Counter(t["name"] for r in site.records for t in r.get("tags") or [])
    tag = max((t for t, n in counts.items() if 2 <= n <= 10), key=lambda t: (counts[t], t))
    tagged = {r["id"] for r in site.records if tag in {t["name"] for t in r.get("tags") or []}}
    page.goto("/harvester/search")
    page.locator('[data-test="search-box"]').fill("data")
    page.locator('[data-test="search-portal"]').select_option(PORTAL)
    page.locator('[data-test="search-tag"]').fill(tag)
    page.locator('[data-test="search-button"]').click()
    page.wait_for_url(re.compile(r"[?&]tag="))
    results = page.locator('[data-test="search-result"]')
    expect(results).to_have_count(len(tagged))
    hrefs = {results.nth(i).locator("a.strong").get_attribute("href") for i in range(len(tagged))}
    assert {h.rsplit("/", 1)[1] for h in hrefs} == tagged, (hrefs, tagged)
    shots(page, "admin-search-filtered")
    link = page.url
    page.goto("/harvester/")
    page.goto(link)  # a filtered search is a link
    expect(page.locator('[data-test="search-tag"]')).to_have_value(tag)
    expect(results).to_have_count(len(tagged))
    with page.expect_download() as download:
        page.locator('[data-test="export-datasets-csv"]').click()
    rows = list(csv.DictReader(io.StringIO(Path(download.value.path()).read_text(encoding="utf-8"))))
    assert {r["source_id"] for r in rows} == tagged
    assert all(tag in json.loads(r["tags"]) for r in rows)


def review_every_change_shown(site, context, page, shots) -> None:
    pending = site.pending()
    assert len(pending) >= 2, pending
    page.goto("/harvester/changes")
    rows = page.locator('[data-test="change-row"]')
    expect(rows).to_have_count(len(pending))
    page.locator('[data-test="bulk-select-all"]').check()
    expect(page.locator('[data-test="bulk-count"]')).to_have_text(f"{len(pending)} selected")
    page.locator('[data-test="bulk-note"]').fill("all of them at once")
    shots(page, "admin-bulk-selected")
    page.locator('[data-test="bulk-reviewed"]').click()
    expect(page.locator('[data-test="status"]')).to_have_text(f"{len(pending)} changes marked reviewed.")
    expect(page.locator('[data-test="changes-empty"]')).to_be_visible()
    assert site.pending() == []
    ids = [p[0] for p in pending]
    assert site.query("SELECT DISTINCT review_outcome, reviewed_by, review_note FROM dataset_changes"
                      " WHERE id = ANY(%s)", ids) == [("reviewed", "admin", "all of them at once")]
    shots(page, "admin-bulk-reviewed")


def run_a_full_sync_now(site, context, page, shots) -> None:
    dag_id = f"harvest_{PORTAL}"
    token = context.request.post(f"{site.url}/auth/token",
                                 data={"username": "admin", "password": _browser.USERS["admin"]})
    assert token.ok, token.text()
    bearer = {"Authorization": f"Bearer {token.json()['access_token']}"}

    def paused(value: bool) -> None:
        response = context.request.patch(f"{site.url}/api/v2/dags/{dag_id}", headers=bearer,
                                         data={"is_paused": value})
        assert response.ok, response.text()

    paused(True)
    page.goto(f"/harvester/portals/{PORTAL}")
    actions = page.locator('[data-test="portal-actions"]')
    expect(actions.locator('[data-test="trigger-problem"]')).to_contain_text("paused")
    expect(actions.locator('[data-test="trigger-full_sync"]')).to_be_disabled()
    shots(page, "admin-portal-paused")
    paused(False)
    page.reload()
    expect(actions.locator('[data-test="trigger-full_sync"]')).to_be_enabled()
    expect(actions.locator('[data-test="trigger-problem"]')).to_have_count(0)
    actions.locator('[data-test="trigger-full_sync"]').click()
    link = actions.locator('[data-test="triggered-run-link"]')
    expect(link).to_be_visible()
    run_id = link.text_content()
    assert link.get_attribute("href").endswith(f"/dags/{dag_id}/runs/{quote(run_id, safe='')}")
    # Airflow's own record of the run, read through its REST API (the api-server's metadata DB; this
    # process's ORM may be configured for another by an earlier test of the session)
    made = context.request.get(f"{site.url}/api/v2/dags/{dag_id}/dagRuns/{quote(run_id, safe='')}", headers=bearer)
    assert made.ok, made.text()
    run = made.json()
    assert run["conf"] == {"full_sync": True, "reconcile": False, "force_removals": False, "takeover": False}
    assert run["triggering_user_name"] == "admin" and run["run_type"] == "manual", run
    shots(page, "admin-portal-triggered")
    link.click()
    page.wait_for_url(re.compile(rf"/dags/{dag_id}/runs/"))
    expect(page.get_by_text(run_id).first).to_be_visible()
    shots(page, "admin-triggered-run-in-airflow")
