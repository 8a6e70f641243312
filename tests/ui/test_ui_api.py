"""The Harvester page's plugin and JSON API, served by the real Airflow api-server app
(airflow.api_fastapi.app.create_app) with Airflow's simple auth manager: real users, real
passwords, real tokens from POST /auth/token, over a portal harvested through real DAG runs.

One harvest for the module (two DAG runs and a CLI run): the tests read what it wrote, and the
review tests each review different changes.
"""
from __future__ import annotations

import json
import uuid
from urllib.parse import quote

import pytest

from harvester.testing.dagtest import Harvest
from harvester.domain.run import STAT_KEYS
from harvester.testing.samples import edited

HDX = "data-humdata-org.jsonl"
PASSWORDS = {"admin": "admin-pw-1", "viewer": "viewer-pw-2", "editor": "editor-pw-3"}
RETITLED = 4  # datasets retitled in the second run: changes that require review
MODEL = "sentence-transformers/all-MiniLM-L6-v2"



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
        records = samples(HDX)
        portal.set_records(records)
        harvest = Harvest(tmp, mp)
        harvest.configure(portal.base_url, max_retries=0, significance={"review_threshold": 0.3})
        assert harvest.run().state == "success"
        current = [edited(r, title=r["title"] + " (revised)") for r in records[:RETITLED]]
        current.append(edited(records[RETITLED], tags=records[RETITLED]["tags"] + [{"name": "ui-test"}]))
        current += records[RETITLED + 1:]
        portal.set_records(current)
        assert harvest.run().state == "success"
        portal.set_records(current[:-10])  # 10 of 41 gone: over the 20% removal guard
        assert main(["harvest", "test", "--full"]) == 0
        yield {"url": url, "records": records, "portal_url": portal.base_url.rstrip("/"), "harvest": harvest,
               "portal": portal}
    finally:
        portal.stop()
        mp.undo()
        with psycopg.connect(pg_server.url("postgres"), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="module")
def client(world):
    from fastapi.testclient import TestClient

    from airflow.api_fastapi.app import create_app, purge_cached_app

    purge_cached_app()
    with TestClient(create_app()) as test_client:
        yield test_client
    purge_cached_app()


@pytest.fixture(scope="module")
def tokens(client):
    """Real tokens from Airflow's own login endpoint."""
    out = {}
    for user, password in PASSWORDS.items():
        response = client.post("/auth/token", json={"username": user, "password": password})
        assert response.status_code == 201, response.text
        out[user] = response.json()["access_token"]
    assert client.post("/auth/token", json={"username": "admin", "password": "wrong"}).status_code == 401
    return out


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
            "/harvester/api/search?q=health", "/harvester/openapi.json"]
PAGES = ["/harvester/", "/harvester/portals/test", "/harvester/changes", "/harvester/datasets/test/{id}",
         "/harvester/search", "/harvester/dags/harvest_test", "/harvester/docs"]


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
        for path in ["/harvester/", "/harvester/portals/test", "/harvester/changes",
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
    assert {"/api/portals", "/api/changes", "/api/changes/{change_id}/review", "/api/search"} <= set(schema["paths"])
    assert "post" in schema["paths"]["/api/changes/{change_id}/review"]


# -- portals and runs ---------------------------------------------------------------------------------
def test_portals(client, tokens, world, db):
    page = get(client, tokens, "/harvester/api/portals")
    assert (page["total"], page["limit"], page["offset"]) == (1, 50, 0)
    (portal,) = page["items"]
    assert portal == get(client, tokens, "/harvester/api/portals/test", "viewer") | {"last_sync_age_seconds": portal["last_sync_age_seconds"]}
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
