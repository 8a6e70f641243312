"""The Harvester page's plugin and JSON API, served by the real Airflow api-server app
(airflow.api_fastapi.app.create_app) with Airflow's simple auth manager: real users, real
passwords, real tokens from POST /auth/token, over a portal harvested through real DAG runs.

One harvest for the module (two DAG runs and a CLI run): the tests read what it wrote, and the
review tests each review different changes. The catalogue holds records the harvester cannot take
(one without an id, one whose modification date is not a date) and records it takes with warnings
(no description, no licence): each run's report (GET /api/runs/{id}/outcomes) lists them.
"""
from __future__ import annotations

import copy
import csv
import gc
import io
import json
import warnings
import uuid
from collections import Counter
from urllib.parse import quote

import pytest

from harvester.testing.dagtest import Harvest
from harvester.domain.run import STAT_KEYS
from harvester.testing.samples import edited

HDX = "data-humdata-org.jsonl"
PASSWORDS = {"admin": "admin-pw-1", "viewer": "viewer-pw-2", "editor": "editor-pw-3"}
RETITLED = 4  # datasets retitled in the second run: changes that require review
MODEL = "sentence-transformers/all-MiniLM-L6-v2@max_seq_128"  # the default local model (issue 40)
NOT_A_DATE = "31/02/2020 25:61"
NO_NOTES, NO_LICENSE = 20, 21  # records served without a description, without a licence


def catalogue(records: list[dict]) -> tuple[list[dict], list[dict]]:
    """The catalogue served: the sample records, one without a description and one without a
    licence (taken, with a warning), and two records that cannot be taken (errors): one without an
    id, modified after any harvest (so every run lists it), one with a modification date that is
    not a date (only a whole listing finds it)."""
    records = copy.deepcopy(records)
    records[NO_NOTES]["notes"] = ""
    records[NO_LICENSE].update(license_id="", license_title="")
    no_id = edited(records[5], name="record-without-id", title="A record without an id")
    del no_id["id"]
    bad_date = copy.deepcopy(records[6])
    bad_date.update(id=str(uuid.uuid4()), name="record-with-a-bad-date", title="A record with a bad date",
                    metadata_modified=NOT_A_DATE)
    return records, [no_id, bad_date]


def expected_codes(listed: list[dict], taken: set[str]) -> Counter:
    """The report of a run, from the records it listed (not from the harvester's code): an error
    per record it cannot take, and the warnings of those it took in (``taken``: their ids)."""
    want = Counter()
    for record in listed:
        if not record.get("id"):
            want["no-identifier"] += 1
        elif record["metadata_modified"] == NOT_A_DATE:
            want["bad-date"] += 1
        elif record["id"] in taken:
            want["no-description"] += not (record.get("notes") or "").strip()
            want["no-license"] += not (record.get("license_id") or record.get("license_title"))
            want["modified-in-future"] += record["metadata_modified"].startswith("2030")
    return +want



# -- set-up: a database, a harvested portal, the Airflow api-server ------------------------------------
@pytest.fixture(scope="module")
def world(pg_server, template_db, airflow_db, tmp_path_factory, samples):
    """A fresh database and a portal harvested twice by the DAG (the second run retitles
    datasets, which then require review, and edits tags) and once by the CLI (a full sync that
    would remove too many datasets: degraded). Airflow is configured with the simple auth manager
    and three users."""
    import psycopg

    from harvester.cli.main import main
    from harvester.testing.ckan_portal import DemoPortal

    mp = pytest.MonkeyPatch()
    name = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_server.url("postgres"), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template_db}"')
    url = pg_server.url(name)
    tmp = tmp_path_factory.mktemp("ui")
    passwords = tmp / "passwords.json"
    passwords.write_text(json.dumps(PASSWORDS))
    mp.setenv("HARVESTER_DATABASE_URL", url)
    mp.setenv("AIRFLOW_CONN_HARVESTER_DB", url)
    mp.setenv("AIRFLOW__CORE__AUTH_MANAGER",
              "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager")
    mp.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS", "admin:admin,viewer:viewer,editor:user")
    mp.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE", str(passwords))
    mp.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS", "False")
    mp.setenv("AIRFLOW__API_AUTH__JWT_SECRET", uuid.uuid4().hex * 2)  # 64 bytes: what HS512 wants
    portal = DemoPortal(records=[])
    portal.start()
    try:
        records, bad = catalogue(samples(HDX))
        portal.set_records(bad + records)
        harvest = Harvest(tmp, mp)
        harvest.configure(portal.base_url, max_retries=0, significance={"review_threshold": 0.3})
        assert harvest.run().state == "success"
        listed = [bad + records]
        current = [edited(r, title=r["title"] + " (revised)") for r in records[:RETITLED]]
        current.append(edited(records[RETITLED], tags=records[RETITLED]["tags"] + [{"name": "ui-test"}]))
        current = bad + current + records[RETITLED + 1:]
        portal.set_records(current)
        assert harvest.run().state == "success"
        listed.append([r for r in current if r["metadata_modified"].startswith("2030")])  # incremental
        portal.set_records(current[:-10])  # 10 of 41 gone: over the 20% removal guard
        assert main(["harvest", "test", "--full"]) == 0
        listed.append(current[:-10])
        yield {"url": url, "records": records, "portal_url": portal.base_url.rstrip("/"), "harvest": harvest,
               "portal": portal, "bad": bad, "listed": listed, "tmp": tmp}
    finally:
        portal.stop()
        mp.undo()
        with psycopg.connect(pg_server.url("postgres"), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def db(world):
    from harvester.store import db as store_db

    conn = store_db.prepare(store_db.connect_url(world["url"]), migrate=False)
    yield conn
    conn.close()


def as_(tokens, user):
    return {"Authorization": f"Bearer {tokens[user]}"}


def get(client, tokens, path, user="admin", **params):
    response = client.get(path, headers=as_(tokens, user), params=params)
    assert response.status_code == 200, (path, response.status_code, response.text)
    return response.json()


def source_ids(world, n):
    return [r["id"] for r in world["records"][:n]]


# -- the plugin --------------------------------------------------------------------------------------
def test_the_plugin_is_loaded_once_with_its_app_and_views(client, tokens):
    from airflow import plugins_manager

    from harvester.ui.app import app
    from harvester.ui.plugin import HarvesterPlugin

    plugins, errors = plugins_manager._get_plugins()
    ours = [p for p in plugins if p.name == "harvester"]
    assert len(ours) == 1 and isinstance(ours[0], HarvesterPlugin)
    assert not [e for e in errors.values() if "harvester" in e.lower()], errors
    assert ours[0].fastapi_apps == [{"app": app, "url_prefix": "/harvester", "name": "Harvester"}]
    views = {v["destination"]: v for v in ours[0].external_views}
    assert views["nav"]["href"] == "/harvester/" and views["nav"]["nav_top_level"] is True
    assert views["dag"]["href"] == "/harvester/dags/{DAG_ID}"
    assert views["nav"]["url_route"] != views["dag"]["url_route"]  # Airflow drops a view whose route is taken

    # What Airflow's own API tells its UI.
    listed = get(client, tokens, "/api/v2/plugins")["plugins"]
    (info,) = [p for p in listed if p["name"] == "harvester"]
    assert {v["destination"] for v in info["external_views"]} == {"nav", "dag"}
    assert info["fastapi_apps"][0]["url_prefix"] == "/harvester"
    assert get(client, tokens, "/api/v2/plugins/importErrors")["total_entries"] == 0


def test_the_entry_point_is_installed_and_the_plugins_folder_stands_aside():
    from importlib.metadata import entry_points

    from airflow._shared.plugins_manager import _load_plugins_from_plugin_directory
    from airflow.configuration import conf

    from harvester.ui.plugin import HarvesterPlugin

    (entry,) = [ep for ep in entry_points(group="airflow.plugins") if ep.name == "harvester"]
    assert entry.value == "harvester.ui.plugin:HarvesterPlugin" and entry.load() is HarvesterPlugin
    # With the entry point installed, plugins/harvester_plugin.py exposes nothing of its own.
    found, errors = _load_plugins_from_plugin_directory(plugins_folder=conf.get("core", "plugins_folder"))
    assert errors == {} and [p.name for p in found] == []


# -- authentication and permissions ---------------------------------------------------------------------
API_GETS = ["/harvester/api/me", "/harvester/api/portals", "/harvester/api/portals/test",
            "/harvester/api/portals/test/runs", "/harvester/api/changes", "/harvester/api/changes?queue=true",
            "/harvester/api/datasets/test/{id}", "/harvester/api/datasets/test/{id}/diff",
            "/harvester/api/search?q=health", "/harvester/api/runs/1/outcomes", "/harvester/api/runs/1/outcomes.csv",
            "/harvester/openapi.json"]
PAGES = ["/harvester/", "/harvester/portals/test", "/harvester/runs/1", "/harvester/changes",
         "/harvester/datasets/test/{id}", "/harvester/search", "/harvester/dags/harvest_test", "/harvester/docs"]


def test_anonymous_requests_get_401_and_pages_send_to_the_login(client, world):
    some = world["records"][0]["id"]
    for path in API_GETS:
        response = client.get(path.format(id=some))
        assert response.status_code == 401, (path, response.text)
        assert response.headers["www-authenticate"] == "Bearer"
    assert client.post("/harvester/api/changes/1/review", json={"action": "reviewed"}).status_code == 401
    for bad in ("not-a-token", "eyJhbGciOiJIUzUxMiJ9.e30.c2ln"):
        assert client.get("/harvester/api/me", headers={"Authorization": f"Bearer {bad}"}).status_code == 401
        client.cookies.set("_token", bad)
        assert client.get("/harvester/api/me").status_code == 401
        client.cookies.clear()
    for path in PAGES:
        response = client.get(path.format(id=some), follow_redirects=False)
        assert response.status_code == 307, path
        assert response.headers["location"].startswith("/auth/login?next=http"), response.headers["location"]
    # Static assets hold no data and need no login.
    static = client.get("/harvester/static/index.html")
    assert static.status_code == 200 and "no-store" not in static.headers.get("cache-control", "")


def test_a_user_the_auth_manager_refuses_gets_403(client, world):
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser

    # A token the auth manager itself issues, for a user with no role: may not read.
    token = get_auth_manager().generate_jwt(SimpleAuthManagerUser(username="nobody", role=None))
    some = world["records"][0]["id"]
    for path in API_GETS:
        response = client.get(path.format(id=some), headers={"Authorization": f"Bearer {token}"})
        assert response.status_code == 403, (path, response.text)
    client.cookies.set("_token", token)
    try:
        response = client.get("/harvester/changes", follow_redirects=False)
        assert response.status_code == 403 and "nobody may not read" in response.text
    finally:
        client.cookies.clear()


def test_me(client, tokens):
    assert get(client, tokens, "/harvester/api/me") == {"user": "admin", "can_review": True}
    assert get(client, tokens, "/harvester/api/me", "viewer") == {"user": "viewer", "can_review": False}
    assert get(client, tokens, "/harvester/api/me", "editor") == {"user": "editor", "can_review": True}


def test_pages_serve_the_shell_to_readers(client, tokens, world):
    from harvester.ui.app import STATIC_DIR

    shell = (STATIC_DIR / "index.html").read_text(encoding="utf-8")
    client.cookies.set("_token", tokens["viewer"])  # as the Airflow UI's iframe sends it
    try:
        for path in ["/harvester/", "/harvester/portals/test", "/harvester/runs/1", "/harvester/changes",
                     f"/harvester/datasets/test/{world['records'][0]['id']}", "/harvester/search"]:
            response = client.get(path)
            assert response.status_code == 200, path
            assert response.headers["content-type"].startswith("text/html") and response.text == shell
            assert response.headers["cache-control"] == "no-store"
        # The DAG tab: a harvest DAG's tab is its portal's page.
        response = client.get("/harvester/dags/harvest_test", follow_redirects=False)
        assert (response.status_code, response.headers["location"]) == (307, "/harvester/portals/test")
        assert client.get("/harvester/dags/some_other_dag").status_code == 404
        docs = client.get("/harvester/docs")
        assert docs.status_code == 200 and "/harvester/openapi.json" in docs.text
        schema = client.get("/harvester/openapi.json").json()
    finally:
        client.cookies.clear()
    assert {"/api/portals", "/api/changes", "/api/changes/{change_id}/review", "/api/search",
            "/api/runs/{run_id}/outcomes", "/api/runs/{run_id}/outcomes.csv"} <= set(schema["paths"])
    assert "post" in schema["paths"]["/api/changes/{change_id}/review"]
    for path in ("/api/runs/{run_id}/outcomes", "/api/runs/{run_id}/outcomes.csv"):
        documented = schema["paths"][path]["get"]
        assert documented["tags"] == ["runs"] and documented["summary"]
        assert {p["name"] for p in documented["parameters"]} >= {"run_id", "severity", "code"}


# -- portals and runs ---------------------------------------------------------------------------------
def test_portals(client, tokens, world, db):
    page = get(client, tokens, "/harvester/api/portals")
    assert (page["total"], page["limit"], page["offset"]) == (1, 50, 0)
    (portal,) = page["items"]
    single = get(client, tokens, "/harvester/api/portals/test", "viewer")
    # one portal adds its duplicates (tests/ui/test_ui_duplicates.py): a portal alone has none
    assert single.pop("duplicates") == {"copies_of": [], "copied_by": [], "copies": 0}
    assert portal == single | {"last_sync_age_seconds": portal["last_sync_age_seconds"]}
    live = len(world["records"])  # the CLI's full sync withheld its removals
    assert (portal["name"], portal["url"], portal["dag_id"], portal["enabled"]) == (
        "test", world["portal_url"], "harvest_test", True)
    assert (portal["live_datasets"], portal["pending_embeddings"], portal["review_queue"]) == (live, 0, RETITLED)
    assert portal["schedule"] is None and portal["next_run"] is None
    assert portal["last_successful_sync"] and 0 <= portal["last_sync_age_seconds"] < 600
    last = portal["last_run"]
    assert (last["mode"], last["status"], last["removals_withheld"], last["skipped"]) == ("full", "committed", 10, 0)
    assert last["dag_run_id"] is None and last["dag_run_url"] is None  # a CLI run
    assert last["duration_seconds"] > 0
    assert portal["badge"] == "degraded"
    assert portal["breaker"]["state"] == "closed" and portal["breaker"]["model"] == MODEL

    assert client.get("/harvester/api/portals/nope", headers=as_(tokens, "admin")).status_code == 404
    assert get(client, tokens, "/harvester/api/portals", offset=1)["items"] == []


def test_runs_newest_first_with_pagination_and_links(client, tokens, db):
    page = get(client, tokens, "/harvester/api/portals/test/runs", "viewer")
    assert page["total"] == 3 and len(page["items"]) == 3
    cli_run, second, first = page["items"]
    assert cli_run["run_id"] > second["run_id"] > first["run_id"]
    assert (cli_run["mode"], cli_run["dag_run_url"], cli_run["logs_url"]) == ("full", None, None)
    assert set(STAT_KEYS) <= set(second["stats"])
    assert (first["stats"]["created"], second["stats"]["updated"]) == (41, RETITLED + 1)
    assert cli_run["stats"]["removals_withheld"] == 10
    for run in (first, second):
        dag_run_id = db.execute("SELECT dag_run_id FROM sync_runs WHERE run_id = %s", (run["run_id"],)).fetchone()[0]
        assert run["dag_run_id"] == dag_run_id and run["status"] == "committed" and run["duration_seconds"] > 0
        assert run["dag_run_url"] == f"/dags/harvest_test/runs/{quote(dag_run_id, safe='')}"
        assert run["logs_url"] == run["dag_run_url"] + "/tasks/upsert"

    two = get(client, tokens, "/harvester/api/portals/test/runs", limit=2)
    assert (two["total"], two["limit"], [r["run_id"] for r in two["items"]]) == (3, 2, [cli_run["run_id"], second["run_id"]])
    rest = get(client, tokens, "/harvester/api/portals/test/runs", limit=2, offset=2)
    assert [r["run_id"] for r in rest["items"]] == [first["run_id"]] and rest["offset"] == 2
    for bad in ({"limit": 0}, {"limit": 501}, {"offset": -1}):
        response = client.get("/harvester/api/portals/test/runs", headers=as_(tokens, "admin"), params=bad)
        assert response.status_code == 422 and next(iter(bad)) in response.text
    assert client.get("/harvester/api/portals/nope/runs", headers=as_(tokens, "admin")).status_code == 404


# -- changes and their review ---------------------------------------------------------------------------
def test_changes_filters_and_pagination(client, tokens, world):
    everything = get(client, tokens, "/harvester/api/changes", limit=500)
    assert everything["total"] == 41 + RETITLED + 1 == len(everything["items"])
    detected = [(c["detected_at"], c["id"]) for c in everything["items"]]
    assert detected == sorted(detected, reverse=True)
    item = everything["items"][0]
    assert {"id", "portal", "dag_id", "source_id", "dataset_title", "change_type", "changed_fields", "significance",
            "requires_review", "detected_at", "old_version", "new_version", "reviewed_at", "reviewed_by",
            "review_note", "review_outcome", "can_review"} <= set(item)

    queue = get(client, tokens, "/harvester/api/changes", queue="true")
    assert queue["total"] == RETITLED
    assert {c["source_id"] for c in queue["items"]} == set(source_ids(world, RETITLED))
    for change in queue["items"]:
        assert (change["change_type"], change["requires_review"], change["portal"], change["dag_id"]) == (
            "title_changed", True, "test", "harvest_test")
        assert change["changed_fields"]["title"]["new"].endswith(" (revised)")
        assert (change["old_version"], change["new_version"], change["can_review"]) == (1, 2, True)
        assert change["reviewed_at"] is None and change["review_outcome"] is None
    assert not any(c["can_review"] for c in get(client, tokens, "/harvester/api/changes", "viewer")["items"])

    def total(**params):
        return get(client, tokens, "/harvester/api/changes", **params)["total"]

    assert total(change_type="title_changed") == RETITLED and total(change_type="metadata_updated") == 1
    assert total(change_type="new", portal="test") == 41
    assert total(min_significance=0.3) == RETITLED and total(min_significance=0) == everything["total"]
    assert total(since="2999-01-01") == 0 and total(since="2000-01-01T00:00:00+02:00") == everything["total"]

    pages = [get(client, tokens, "/harvester/api/changes", limit=20, offset=o) for o in (0, 20, 40)]
    assert [len(p["items"]) for p in pages] == [20, 20, everything["total"] - 40]
    assert [c["id"] for p in pages for c in p["items"]] == [c["id"] for c in everything["items"]]

    for params, name in (({"since": "yesterday"}, "since"), ({"change_type": "edited"}, "change_type"),
                         ({"portal": "nope"}, "portal"), ({"min_significance": 2}, "min_significance"),
                         ({"queue": "maybe"}, "queue"), ({"limit": 1000}, "limit")):
        response = client.get("/harvester/api/changes", headers=as_(tokens, "admin"), params=params)
        assert response.status_code == 422, params
        assert response.json()["detail"][0]["loc"][-1] == name


def test_review_and_dismiss(client, tokens, world, db):
    queue = get(client, tokens, "/harvester/api/changes", queue="true")["items"]
    first, second = queue[0]["id"], queue[1]["id"]
    path = f"/harvester/api/changes/{first}/review"

    response = client.post(path, headers=as_(tokens, "viewer"), json={"action": "reviewed"})
    assert response.status_code == 403 and "harvest_test" in response.json()["detail"]
    assert client.get(path, headers=as_(tokens, "admin")).status_code == 405
    assert client.post(path, json={"action": "reviewed"}).status_code == 401
    for body in ({"action": "approve"}, {}, {"action": "reviewed", "extra": 1}, {"action": "reviewed", "note": "x" * 2001}):
        assert client.post(path, headers=as_(tokens, "admin"), json=body).status_code == 422, body
    form = {**as_(tokens, "admin"), "Content-Type": "application/x-www-form-urlencoded"}
    assert client.post(path, headers=form, content="action=reviewed").status_code == 422  # JSON only
    assert client.post("/harvester/api/changes/999999/review", headers=as_(tokens, "admin"),
                       json={"action": "reviewed"}).status_code == 404

    response = client.post(path, headers=as_(tokens, "admin"), json={"action": "reviewed", "note": "checked on HDX"})
    assert response.status_code == 200, response.text
    change = response.json()
    assert (change["id"], change["review_outcome"], change["reviewed_by"], change["review_note"]) == (
        first, "reviewed", "admin", "checked on HDX")
    assert change["reviewed_at"]
    stored = db.execute("SELECT review_outcome, reviewed_by, review_note, reviewed_at > now() - interval '1 minute'"
                        " FROM dataset_changes WHERE id = %s", (first,)).fetchone()
    assert stored == ("reviewed", "admin", "checked on HDX", True)

    again = client.post(path, headers=as_(tokens, "editor"), json={"action": "dismissed"})
    assert again.status_code == 409 and "already reviewed by admin" in again.json()["detail"]

    dismissed = client.post(f"/harvester/api/changes/{second}/review", headers=as_(tokens, "editor"),
                            json={"action": "dismissed"})
    assert dismissed.status_code == 200
    assert (dismissed.json()["review_outcome"], dismissed.json()["reviewed_by"], dismissed.json()["review_note"]) == (
        "dismissed", "editor", None)

    left = get(client, tokens, "/harvester/api/changes", queue="true")
    assert left["total"] == RETITLED - 2 and {first, second}.isdisjoint(c["id"] for c in left["items"])
    assert get(client, tokens, "/harvester/api/portals/test")["review_queue"] == RETITLED - 2
    # Reviewed changes stay in the list of all changes, with their review.
    everything = {c["id"]: c for c in get(client, tokens, "/harvester/api/changes", limit=500)["items"]}
    assert everything[first]["review_outcome"] == "reviewed" and everything[second]["reviewed_by"] == "editor"


def test_cli_review(world, db, capsys):
    from harvester.cli.main import main

    capsys.readouterr()
    assert main(["review", "--queue", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert listed["total"] == len(listed["items"]) >= 1
    change_id = listed["items"][0]["id"]
    assert main(["review", "--queue"]) == 0
    out = capsys.readouterr().out
    assert f"[{change_id}] TITLE_CHANGED 30%" in out and "harvester review <id>" in out

    assert main(["review", str(change_id), "--note", "fine", "--by", "carol"]) == 0
    assert f"change {change_id} (title_changed" in capsys.readouterr().out
    assert db.execute("SELECT review_outcome, reviewed_by, review_note FROM dataset_changes WHERE id = %s",
                      (change_id,)).fetchone() == ("reviewed", "carol", "fine")
    assert main(["review", str(change_id), "--dismiss", "--by", "dave"]) == 2
    assert "already reviewed by carol" in capsys.readouterr().err
    assert main(["review", "--queue", "-p", "test", "--json"]) == 0
    assert change_id not in [c["id"] for c in json.loads(capsys.readouterr().out)["items"]]
    assert main(["review", "999999", "--by", "dave"]) == 2
    assert "no change with id 999999" in capsys.readouterr().err
    assert main(["review"]) == 2


# -- datasets and search --------------------------------------------------------------------------------
def test_dataset_versions_changes_and_diff(client, tokens, world):
    record = world["records"][RETITLED - 1]
    base = f"/harvester/api/datasets/test/{record['id']}"
    dataset = get(client, tokens, base, "viewer")
    assert (dataset["portal"], dataset["source_id"], dataset["title"]) == ("test", record["id"], record["title"] + " (revised)")
    assert dataset["removed_at"] is None and dataset["url"]
    assert [(v["version_number"], v["change_type"], v["is_current"]) for v in dataset["versions"]] == [
        (2, "title_changed", True), (1, "new", False)]
    assert [c["change_type"] for c in dataset["changes"]] == ["title_changed", "new"]
    # the current version's last sighting is its dataset's (sql/033), the replaced one's its own
    current, replaced = dataset["versions"]
    assert current["last_seen_at"] == dataset["last_seen_at"] is not None
    assert replaced["first_seen_at"] <= replaced["last_seen_at"] < current["first_seen_at"] <= current["last_seen_at"]

    diff = get(client, tokens, base + "/diff", "viewer")
    assert (diff["from"], diff["to"]) == (1, 2)
    fields = {f["field"]: f for f in diff["fields"]}
    assert [f["field"] for f in diff["fields"]][:2] == ["title", "description"]
    old_title, new_title = dataset["versions"][1]["title"], dataset["versions"][0]["title"]
    assert new_title == old_title + " (revised)"
    assert fields["title"] == {"field": "title", "old": old_title, "new": new_title, "changed": True}
    assert [f["field"] for f in diff["fields"] if f["changed"]] == ["title"]
    assert any(line.startswith("+title: ") for line in diff["diff"])
    same = get(client, tokens, base + "/diff", **{"from": 2, "to": 2})
    assert not any(f["changed"] for f in same["fields"]) and same["diff"] == []
    assert (diff["versions"]["from"]["last_seen_at"], diff["versions"]["to"]["last_seen_at"]) == (
        replaced["last_seen_at"], current["last_seen_at"])
    first = get(client, tokens, base + "/diff", to=1)
    assert first["from"] is None and first["fields"][0]["new"] == old_title

    for path, params in ((base + "/diff", {"to": 9}), (base + "/diff", {"from": 7, "to": 2}),
                         ("/harvester/api/datasets/test/no-such-id", {}), (f"/harvester/api/datasets/nope/{record['id']}", {})):
        assert client.get(path, headers=as_(tokens, "admin"), params=params).status_code == 404, (path, params)


def test_search(client, tokens, world):
    record = world["records"][10]
    found = get(client, tokens, "/harvester/api/search", "viewer", q=record["title"], limit=3)
    assert found["model"] == MODEL and len(found["items"]) == 3
    best = found["items"][0]
    assert (best["rank"], best["portal"], best["source_id"], best["title"]) == (1, "test", record["id"], record["title"])
    assert 0 < best["score"] <= 1 and best["url"]
    assert get(client, tokens, "/harvester/api/search", q=record["title"], portal="test", limit=1)["items"][0][
        "source_id"] == record["id"]
    assert best["matched"] == ["text", "vector"] and "snippet" in best and "organization" in best
    text = get(client, tokens, "/harvester/api/search", q=record["title"], mode="text", limit=2)
    assert text["mode"] == "text" and text["model"] is None and text["items"][0]["source_id"] == record["id"]
    assert text["items"][0]["matched"] == ["text"] and set(text["timings"]) == {"embed_ms", "sql_ms"}
    filtered = get(client, tokens, "/harvester/api/search", q=record["title"], portal="test", since="2000-01-01",
                   until="2100-01-01T00:00:00Z", include_removed="true", limit=3)
    assert filtered["items"][0]["source_id"] == record["id"]
    assert get(client, tokens, "/harvester/api/search", q=record["title"], tag="no-such-tag-anywhere")["items"] == []
    for params in ({"q": ""}, {"q": "   "}, {"q": "x", "portal": "nope"}, {"q": "x", "limit": 101}, {},
                   {"q": "x", "mode": "fuzzy"}, {"q": "x", "since": "yesterday"}):
        assert client.get("/harvester/api/search", headers=as_(tokens, "admin"), params=params).status_code == 422


def test_search_snippets_mark_the_matches_and_nothing_of_the_records_markup(client, tokens, world):
    """(issue 38, finding 4) A description's own markdown (bold, links) is dropped from the snippet:
    its only ``**`` are around words the query matched."""
    import re

    cases = [(world["records"][3], "OpenStreetMap extracts licensed", "**ALL DATA EXCEPT"),  # its own **bold**
             (world["records"][16], "ReliefWeb Crises app", "[ReliefWeb's Crises app](http")]  # a markdown link
    for record, q, markup in cases:
        assert markup in record["notes"]
        (item,) = [i for i in get(client, tokens, "/harvester/api/search", q=q, mode="text", limit=10)["items"]
                   if i["source_id"] == record["id"]]
        snippet = item["snippet"]
        parts = snippet.split("**")
        assert len(parts) % 2 == 1 and len(parts) > 1, snippet  # balanced, and something matched
        stems = {w.lower()[:4] for w in q.split()}
        for marked in parts[1::2]:  # only query words (as stemmed: "licensed" finds "LICENSE")
            words = [w for w in re.findall(r"[a-z]+", marked.lower()) if len(w) > 1]
            assert words and all(w[:4] in stems for w in words), (marked, snippet)
        assert not any(c in snippet for c in "[]<>#`") and "](" not in snippet, snippet
        assert "http" not in snippet, snippet


def test_a_portal_only_the_database_knows_has_its_pages_and_answers(client, tokens, world, monkeypatch):
    """(issue 38, finding 4) A portal not in portals.yaml (harvested from the CLI, or removed from
    it) is found by the name its runs recorded: its page, runs, changes, datasets and search
    answer, marked as not configured; a name nowhere is still 404, saying where it looked."""
    listed = get(client, tokens, "/harvester/api/portals/test")
    runs = get(client, tokens, "/harvester/api/portals/test/runs")
    other = world["tmp"] / "only-other-portals.yaml"
    other.write_text(json.dumps({"portals": [{"name": "other", "url": "http://127.0.0.1:9/other", "schedule": None}]}))
    monkeypatch.setenv("HARVESTER_PORTALS_FILE", str(other))
    assert [(p["name"], p["configured"]) for p in get(client, tokens, "/harvester/api/portals")["items"]] == [
        ("other", True), ("test", False)]

    portal = get(client, tokens, "/harvester/api/portals/test", "viewer")
    assert (portal["name"], portal["url"], portal["configured"], portal["dag_id"], portal["in_airflow"]) == (
        "test", world["portal_url"], False, None, False)
    assert listed["configured"] is True
    same = ("live_datasets", "last_successful_sync", "review_queue", "duplicates", "badge")
    assert {k: portal[k] for k in same} == {k: listed[k] for k in same}
    unlisted_runs = get(client, tokens, "/harvester/api/portals/test/runs", "viewer")
    assert [r["run_id"] for r in unlisted_runs["items"]] == [r["run_id"] for r in runs["items"]]
    assert all(r["dag_run_url"] is None and r["logs_url"] is None for r in unlisted_runs["items"])
    changes = get(client, tokens, "/harvester/api/changes", portal="test", queue="false")
    assert changes["total"] > 0 and {c["portal"] for c in changes["items"]} == {"test"}
    record = world["records"][10]
    dataset = get(client, tokens, f"/harvester/api/datasets/test/{record['id']}")
    assert (dataset["portal"], dataset["source_id"]) == ("test", record["id"])
    assert get(client, tokens, f"/harvester/api/datasets/test/{record['id']}/diff")["to"] >= 1
    found = get(client, tokens, "/harvester/api/search", q=record["title"], portal="test", limit=1)["items"]
    assert [(i["portal"], i["source_id"]) for i in found] == [("test", record["id"])]
    assert get(client, tokens, "/harvester/api/duplicates", portal="test")["total"] == 0

    for path in ("/harvester/api/portals/nope", "/harvester/api/portals/nope/runs",
                 f"/harvester/api/datasets/nope/{record['id']}"):
        response = client.get(path, headers=as_(tokens, "admin"))
        assert response.status_code == 404, (path, response.text)
        assert response.json()["detail"] == "no portal named 'nope' in portals.yaml or the harvester database"
    response = client.get("/harvester/api/changes", headers=as_(tokens, "admin"), params={"portal": "nope"})
    assert response.status_code == 422 and "no portal named 'nope'" in response.text


def test_the_portals_list_shows_the_portals_only_the_database_knows(client, tokens, world, monkeypatch):
    """(issue 38, finding 4) GET /api/portals lists portals.yaml's portals, then those only the
    harvester database knows, each once by the name its latest run recorded, with the state a
    listed portal has (the same overview), marked not configured: no DAG, schedule or next run;
    one whose URL portals.yaml lists under another name is that portal, not listed twice."""
    listed = get(client, tokens, "/harvester/api/portals")["items"][0]
    assert (listed["name"], listed["configured"]) == ("test", True)
    other = world["tmp"] / "portals-without-test.yaml"
    other.write_text(json.dumps({"portals": [{"name": "other", "url": "http://127.0.0.1:9/other", "schedule": None}]}))
    monkeypatch.setenv("HARVESTER_PORTALS_FILE", str(other))
    page = get(client, tokens, "/harvester/api/portals", "viewer")
    assert page["total"] == 2 and [(p["name"], p["configured"]) for p in page["items"]] == [
        ("other", True), ("test", False)]
    unlisted = page["items"][1]
    single = get(client, tokens, "/harvester/api/portals/test")
    single.pop("duplicates")
    assert unlisted == single | {"last_sync_age_seconds": unlisted["last_sync_age_seconds"]}
    assert (unlisted["url"], unlisted["dag_id"], unlisted["enabled"], unlisted["schedule"], unlisted["next_run"],
            unlisted["in_airflow"]) == (world["portal_url"], None, None, None, None, False)
    assert unlisted["last_run"]["dag_run_url"] is None
    same = ("live_datasets", "pending_embeddings", "last_successful_sync", "last_sync_mode", "sync_status",
            "review_queue", "badge")
    assert {k: unlisted[k] for k in same} == {k: listed[k] for k in same}
    assert unlisted["last_run"] | {"dag_run_url": None} == listed["last_run"] | {"dag_run_url": None}
    assert [p["name"] for p in get(client, tokens, "/harvester/api/portals", limit=1, offset=1)["items"]] == ["test"]

    # renamed in portals.yaml: the portal under its new name, once
    renamed = world["tmp"] / "portals-renamed.yaml"
    renamed.write_text(json.dumps({"portals": [{"name": "renamed", "url": world["portal_url"], "schedule": None}]}))
    monkeypatch.setenv("HARVESTER_PORTALS_FILE", str(renamed))
    page = get(client, tokens, "/harvester/api/portals")
    assert page["total"] == 1 and [(p["name"], p["configured"]) for p in page["items"]] == [("renamed", True)]


def test_the_dag_tab_of_a_portal_gone_from_portals_yaml_opens_its_page(client, tokens, world, monkeypatch):
    """(issue 38, finding 4) The Harvester tab of harvest_<name>, whose portal was removed from
    portals.yaml (its DAG lingers in Airflow with its runs), is the portal's page when the
    harvester database knows a portal by that name; other DAGs still say they harvest nothing."""
    other = world["tmp"] / "portals-dag-tab.yaml"
    other.write_text(json.dumps({"portals": [{"name": "other", "url": "http://127.0.0.1:9/other", "schedule": None}]}))
    monkeypatch.setenv("HARVESTER_PORTALS_FILE", str(other))
    client.cookies.set("_token", tokens["viewer"])
    try:
        response = client.get("/harvester/dags/harvest_test", follow_redirects=False)
        assert (response.status_code, response.headers.get("location")) == (307, "/harvester/portals/test"), (
            response.status_code, response.text)
        assert client.get("/harvester/dags/harvest_other", follow_redirects=False).headers["location"] == (
            "/harvester/portals/other")
        for dag_id in ("harvest_nope", "harvest_", "some_other_dag"):
            response = client.get(f"/harvester/dags/{dag_id}", follow_redirects=False)
            assert response.status_code == 404 and "Not a harvest DAG" in response.text, dag_id
    finally:
        client.cookies.clear()


def test_the_api_docs_page_loads_nothing_from_another_host(client, tokens):
    """(issue 38, finding 4) /harvester/docs works offline: its page and the scripts and styles it
    loads are served here (FastAPI's Swagger UI loads from a CDN: a blank page offline)."""
    import re

    assert client.get("/harvester/docs", follow_redirects=False).status_code == 307  # to Airflow's login
    client.cookies.set("_token", tokens["viewer"])
    try:
        page = client.get("/harvester/docs")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assets = re.findall(r'<(?:script|link)[^>]*(?:src|href)="([^"]+)"', page.text)
        assert assets and all(a.startswith("/harvester/static/") for a in assets), assets
        assert "//" not in " ".join(assets) and "cdn" not in page.text.lower()
        for asset in assets:
            response = client.get(asset)
            assert response.status_code == 200 and "http://" not in response.text and "https://" not in response.text, asset
    finally:
        client.cookies.clear()


# -- a run's report --------------------------------------------------------------------------------------
def run_ids(client, tokens) -> list[int]:
    """The module's runs, oldest first: the two DAG runs, the CLI's full sync."""
    return [r["run_id"] for r in reversed(get(client, tokens, "/harvester/api/portals/test/runs")["items"])][:3]


def all_rows(client, tokens, run_id, **params) -> list[dict]:
    """Every row of the run's report, page after page."""
    rows, offset = [], 0
    while True:
        page = get(client, tokens, f"/harvester/api/runs/{run_id}/outcomes", "viewer", limit=7, offset=offset, **params)
        rows += page["items"]
        offset += 7
        if offset >= page["total"]:
            assert len(rows) == page["total"]
            return rows


def test_a_runs_report_lists_the_records_it_could_not_take_as_they_are(client, tokens, world, db):
    first, second, cli_run = run_ids(client, tokens)
    ids = {r["id"] for r in world["records"]}
    edited_ids = set(source_ids(world, RETITLED + 1))
    for run_id, listed, taken in ((first, world["listed"][0], ids), (second, world["listed"][1], edited_ids),
                                  (cli_run, world["listed"][2], set())):
        report = get(client, tokens, f"/harvester/api/runs/{run_id}/outcomes", "viewer", limit=500)
        rows = report["items"]
        want = expected_codes(listed, taken)
        if run_id == cli_run:  # its removals were withheld: the report says which
            want["removal-withheld"] = 10
        assert Counter(r["code"] for r in rows) == want, run_id
        # the groups count what the rows hold, errors first, then the most frequent
        assert {g["code"]: g["count"] for g in report["groups"]} == want
        assert [g["severity"] for g in report["groups"]] == sorted((g["severity"] for g in report["groups"]),
                                                                   key=["error", "warning"].index)
        by_severity = Counter(r["severity"] for r in rows)
        assert report["counts"] == {"errors": by_severity["error"], "warnings": by_severity["warning"]}
        assert report["total"] == len(rows) and (report["limit"], report["offset"]) == (500, 0)
        for group in report["groups"]:
            mine = [r for r in rows if r["code"] == group["code"]]
            assert {r["severity"] for r in mine} == {group["severity"]}
            assert group["message"] == mine[0]["message"]
            assert group["examples"] == list(dict.fromkeys(r["source_id"] or f"#{r['position']}" for r in mine))[:3]
        assert all(r["run_id"] == run_id and r["portal_url"] == world["portal_url"] for r in rows)
        # the same rows as the database holds, counted apart
        assert db.execute("SELECT count(*) FROM record_outcomes WHERE run_id = %s", (run_id,)).fetchone()[0] == len(rows)

    report = get(client, tokens, f"/harvester/api/runs/{first}/outcomes", limit=500)
    run = report["run"]
    assert (run["run_id"], run["portal"], run["portal_url"], run["dag_id"], run["portal_configured"]) == (
        first, "test", world["portal_url"], "harvest_test", True)
    assert (run["mode"], run["status"], run["stats"]["created"], run["stats"]["failed"]) == ("full", "committed", 41, 2)
    assert run["started_at"] < run["finished_at"] and run["dag_run_url"].startswith("/dags/harvest_test/runs/")
    no_id, bad_date = world["bad"]
    (missing,) = [r for r in report["items"] if r["code"] == "no-identifier"]
    assert missing["source_id"] is None and missing["severity"] == "error" and missing["position"] >= 1
    assert no_id["name"] in missing["message"] and missing["field"] == "id"
    (undated,) = [r for r in report["items"] if r["code"] == "bad-date"]
    assert (undated["source_id"], undated["field"], undated["value"]) == (bad_date["id"], "metadata_modified", NOT_A_DATE)
    assert NOT_A_DATE in undated["message"]
    (unlicensed,) = [r for r in report["items"] if r["code"] == "no-license"]
    assert (unlicensed["source_id"], unlicensed["severity"]) == (world["records"][NO_LICENSE]["id"], "warning")
    positions = [r["position"] for r in report["items"] if r["severity"] == "warning"]
    assert positions == sorted(positions)  # errors first, then in listing order
    assert [r["severity"] for r in report["items"]] == sorted((r["severity"] for r in report["items"]),
                                                              key=["error", "warning"].index)
    # pages of 7 make the same list
    assert all_rows(client, tokens, first) == report["items"]


def test_a_runs_report_filtered_by_severity_and_code(client, tokens):
    first = run_ids(client, tokens)[0]
    everything = get(client, tokens, f"/harvester/api/runs/{first}/outcomes", limit=500)
    for severity in ("error", "warning"):
        report = get(client, tokens, f"/harvester/api/runs/{first}/outcomes", severity=severity, limit=500)
        mine = [r for r in everything["items"] if r["severity"] == severity]
        assert report["items"] == mine and report["total"] == len(mine) > 0
        assert {g["severity"] for g in report["groups"]} == {severity}
        assert [g for g in everything["groups"] if g["severity"] == severity] == report["groups"]
        assert report["counts"] == everything["counts"]  # the run's counts, whatever is shown
    report = get(client, tokens, f"/harvester/api/runs/{first}/outcomes", code="no-description", limit=500)
    assert report["items"] == [r for r in everything["items"] if r["code"] == "no-description"]
    assert get(client, tokens, f"/harvester/api/runs/{first}/outcomes", code="no-description",
               severity="error")["total"] == 0
    # a blank filter is no filter (a form's "all")
    assert get(client, tokens, f"/harvester/api/runs/{first}/outcomes", severity="", code="", limit=500) == everything


def read_csv(response) -> list[dict]:
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "text/csv; charset=utf-8"
    lines = response.text.splitlines()
    rows = list(csv.DictReader(io.StringIO(response.text)))
    assert len(lines) == len(rows) + 1  # a header, then one line per row (no message spans lines)
    return rows


def connections(db) -> int:
    return db.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()").fetchone()[0]


def test_a_runs_report_as_csv(client, tokens, db):
    before = connections(db)
    with warnings.catch_warnings(record=True) as caught:  # psycopg warns of a connection never closed
        warnings.simplefilter("always", ResourceWarning)
        downloads(client, tokens)
        gc.collect()
    assert not [w for w in caught if "connection" in str(w.message)], [str(w.message) for w in caught]
    assert connections(db) == before


def downloads(client, tokens):
    from harvester.domain.outcomes import CSV_FIELDS

    for run_id in run_ids(client, tokens):
        everything = get(client, tokens, f"/harvester/api/runs/{run_id}/outcomes", limit=500)
        path = f"/harvester/api/runs/{run_id}/outcomes.csv"
        response = client.get(path, headers=as_(tokens, "viewer"))
        assert response.headers["content-disposition"] == f'attachment; filename="harvester-run-{run_id}-outcomes.csv"'
        assert response.text.splitlines()[0] == ",".join(CSV_FIELDS)
        rows = read_csv(response)
        assert len(rows) == everything["total"]

        def text(v):
            return "" if v is None else str(v)

        assert rows == [{k: text(item[k]) for k in CSV_FIELDS} for item in everything["items"]]
        for severity in ("error", "warning"):
            mine = read_csv(client.get(path, headers=as_(tokens, "viewer"), params={"severity": severity}))
            assert [r["severity"] for r in mine] == [severity] * everything["counts"][severity + "s"]
        for group in everything["groups"]:
            mine = read_csv(client.get(path, headers=as_(tokens, "viewer"), params={"code": group["code"]}))
            assert len(mine) == group["count"] and {r["code"] for r in mine} == {group["code"]}
    # each download streams on its own connection, closed when the stream ends (and on a 404)
    assert client.get("/harvester/api/runs/999999/outcomes.csv", headers=as_(tokens, "viewer")).status_code == 404


def test_the_cli_report_says_what_the_api_says(client, tokens, world, tmp_path, capsys):
    """`harvester report` on the same database: the same run, counts and groups as the API, and its
    --csv the same bytes as the API's CSV, for every run of the module and each severity."""
    from harvester.cli.main import main

    for run_id in run_ids(client, tokens):
        for severity in (None, "error", "warning"):
            params = {"severity": severity} if severity else {}
            api = get(client, tokens, f"/harvester/api/runs/{run_id}/outcomes", **params)
            capsys.readouterr()
            assert main(["report", str(run_id), "--json", *(["--severity", severity] if severity else [])]) == 0
            cli = json.loads(capsys.readouterr().out)
            assert cli["groups"] == api["groups"] and cli["counts"] == api["counts"], (run_id, severity)
            assert cli["run"]["run_id"] == api["run"]["run_id"] == run_id
            target = tmp_path / f"{run_id}-{severity}.csv"
            assert main(["report", str(run_id), "--csv", str(target), *(["--severity", severity] if severity else [])
                         ]) == 0
            response = client.get(f"/harvester/api/runs/{run_id}/outcomes.csv", params=params,
                                  headers=as_(tokens, "admin"))
            assert target.read_bytes() == response.content, (run_id, severity)


def test_a_runs_report_refuses_what_is_not_there(client, tokens, world):
    first = run_ids(client, tokens)[0]
    for path in ("/harvester/api/runs/999999/outcomes", "/harvester/api/runs/999999/outcomes.csv"):
        response = client.get(path, headers=as_(tokens, "admin"))
        assert response.status_code == 404 and response.json()["detail"] == "no run with id 999999"
    for suffix in ("", ".csv"):
        path = f"/harvester/api/runs/{first}/outcomes{suffix}"
        for params, name, value in (({"severity": "fatal"}, "severity", "fatal"),
                                    ({"code": "no-such-reason"}, "code", "no-such-reason"),
                                    ({"severity": "error", "code": "Bad-Date"}, "code", "Bad-Date")):
            response = client.get(path, headers=as_(tokens, "admin"), params=params)
            assert response.status_code == 422, (path, params)
            (detail,) = response.json()["detail"]
            assert detail["loc"] == ["query", name] and value in detail["msg"]
    for params in ({"limit": 0}, {"limit": 501}, {"offset": -1}):
        response = client.get(f"/harvester/api/runs/{first}/outcomes", headers=as_(tokens, "admin"), params=params)
        assert response.status_code == 422 and response.json()["detail"][0]["loc"][-1] == next(iter(params))
    assert client.get("/harvester/api/runs/first/outcomes", headers=as_(tokens, "admin")).status_code == 422


def test_each_run_of_a_portal_says_how_many_errors_and_warnings(client, tokens, db):
    page = get(client, tokens, "/harvester/api/portals/test/runs", "viewer")
    for run in page["items"]:
        errors, warnings = db.execute(
            "SELECT count(*) FILTER (WHERE severity = 'error'), count(*) FILTER (WHERE severity = 'warning')"
            " FROM record_outcomes WHERE run_id = %s", (run["run_id"],)).fetchone()
        assert (run["errors"], run["warnings"]) == (errors, warnings)
        report = get(client, tokens, f"/harvester/api/runs/{run['run_id']}/outcomes", limit=1)
        assert report["counts"] == {"errors": errors, "warnings": warnings}
    first = page["items"][-1]
    assert first["errors"] == 2 and first["warnings"] > 0


def test_a_run_of_a_portal_gone_from_portals_yaml_keeps_its_report(client, tokens, world, monkeypatch):
    first = run_ids(client, tokens)[0]
    before = get(client, tokens, f"/harvester/api/runs/{first}/outcomes", limit=500)
    other = world["tmp"] / "other-portals.yaml"
    other.write_text(json.dumps({"portals": [{"name": "other", "url": "http://127.0.0.1:9/other", "schedule": None}]}))
    monkeypatch.setenv("HARVESTER_PORTALS_FILE", str(other))
    assert [(p["name"], p["configured"]) for p in get(client, tokens, "/harvester/api/portals")["items"]] == [
        ("other", True), ("test", False)]
    after = get(client, tokens, f"/harvester/api/runs/{first}/outcomes", limit=500)
    assert (after["run"]["portal"], after["run"]["portal_url"], after["run"]["dag_id"],
            after["run"]["portal_configured"]) == ("test", world["portal_url"], None, False)
    assert after["run"]["dag_run_url"] is None and after["run"]["dag_run_id"] == before["run"]["dag_run_id"]
    assert (after["groups"], after["items"], after["counts"]) == (before["groups"], before["items"], before["counts"])
    assert len(read_csv(client.get(f"/harvester/api/runs/{first}/outcomes.csv", headers=as_(tokens, "admin")))) == after["total"]


# -- last: a failed run --------------------------------------------------------------------------------
def test_a_failed_run_is_badged_and_links_to_the_failed_tasks_log(client, tokens, world):
    world["portal"].fail_actions = {"package_search": 500}
    try:
        assert world["harvest"].run().state == "failed"
    finally:
        world["portal"].fail_actions = set()
    portal = get(client, tokens, "/harvester/api/portals/test")
    assert portal["badge"] == "failed"
    assert portal["last_run"]["status"] == "failed" and "PortalUnavailable" in portal["last_run"]["error"]
    failed = get(client, tokens, "/harvester/api/portals/test/runs", limit=1)["items"][0]
    assert failed["run_id"] == portal["last_run"]["run_id"] and failed["finished_at"]
    assert failed["logs_url"] == failed["dag_run_url"] + "/tasks/fetch_modified"
