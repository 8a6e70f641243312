"""What an operator does from the Harvester page besides reading (issue 38, finding 8): review many
changes at once, export what a list shows, start a portal's DAG now. Against Airflow's own
api-server app (the plugin mounted) with the simple auth manager, real users and tokens, over a
portal harvested twice through real DAG runs (the second run retitles datasets: changes that
require review) into a real database; the DAG runs a trigger creates are read back from Airflow's
metadata database."""
from __future__ import annotations

import csv
import io
import json
import uuid
from urllib.parse import quote

import pytest
import yaml

from harvester.testing.samples import edited

HDX = "data-humdata-org.jsonl"
PASSWORDS = {"admin": "admin-pw-1", "viewer": "viewer-pw-2", "editor": "editor-pw-3"}
RETITLED = 6
TAGGED = 3  # datasets that get the tag "bulk-test" in the second run


@pytest.fixture(scope="module")
def world(pg_server, template_db, airflow_db, tmp_path_factory, samples):
    """A fresh database, the portal ``test`` harvested twice by its DAG (dag.test()), and a
    portals.yaml that also names a portal whose DAG Airflow never parsed (``unparsed``)."""
    import psycopg

    from harvester.testing.ckan_portal import DemoPortal
    from harvester.testing.dagtest import Harvest

    mp = pytest.MonkeyPatch()
    name = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_server.url("postgres"), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template_db}"')
    url = pg_server.url(name)
    tmp = tmp_path_factory.mktemp("ui-actions")
    passwords = tmp / "passwords.json"
    passwords.write_text(json.dumps(PASSWORDS))
    mp.setenv("HARVESTER_DATABASE_URL", url)
    mp.setenv("AIRFLOW_CONN_HARVESTER_DB", url)
    mp.setenv("AIRFLOW__CORE__AUTH_MANAGER",
              "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager")
    mp.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS", "admin:admin,viewer:viewer,editor:user")
    mp.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE", str(passwords))
    mp.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS", "False")
    mp.setenv("AIRFLOW__API_AUTH__JWT_SECRET", uuid.uuid4().hex * 2)
    portal = DemoPortal(records=[])
    portal.start()
    try:
        records = samples(HDX)
        portal.set_records(records)
        harvest = Harvest(tmp, mp)
        path = harvest.configure(portal.base_url, max_retries=0, significance={"review_threshold": 0.3})
        assert harvest.run().state == "success"
        current = [edited(r, title=r["title"] + " (revised)") for r in records[:RETITLED]]
        current += [edited(r, tags=r["tags"] + [{"name": "bulk-test"}]) for r in records[RETITLED:RETITLED + TAGGED]]
        portal.set_records(current + records[RETITLED + TAGGED:])
        assert harvest.run().state == "success"
        document = yaml.safe_load(path.read_text())
        document["portals"].append({**document["portals"][0], "name": "unparsed",
                                    "url": portal.base_url.rstrip("/") + "/unparsed"})
        path.write_text(yaml.safe_dump(document))
        yield {"url": url, "records": records, "portal_url": portal.base_url.rstrip("/")}
    finally:
        portal.stop()
        mp.undo()
        with psycopg.connect(pg_server.url("postgres"), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def as_(tokens, user):
    return {"Authorization": f"Bearer {tokens[user]}"}


def query(world, sql, *params):
    import psycopg

    with psycopg.connect(world["url"]) as conn:
        return conn.execute(sql, params).fetchall()


def queue_ids(world) -> list[int]:
    return [r[0] for r in query(world, "SELECT id FROM dataset_changes WHERE requires_review"
                                       " AND review_outcome IS NULL ORDER BY id")]


# -- bulk review ------------------------------------------------------------------------------------
def test_many_changes_are_reviewed_at_once(world, client, tokens):
    """Every change of the review queue's page at once: one request, each marked by the user with
    the note; the answer says how many; a change reviewed already keeps its review."""
    pending = queue_ids(world)
    assert len(pending) >= RETITLED, pending
    first, rest = pending[0], pending[1:]
    one = client.post(f"/harvester/api/changes/{first}/review", headers=as_(tokens, "editor"),
                      json={"action": "dismissed", "note": "single"})
    assert one.status_code == 200, one.text
    response = client.post("/harvester/api/changes/review", headers=as_(tokens, "editor"),
                           json={"ids": pending, "action": "reviewed", "note": "checked the retitles"})
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["marked"] == len(rest) and answer["marked_ids"] == rest
    assert answer["already_reviewed"] == [first]
    rows = query(world, "SELECT id, review_outcome, reviewed_by, review_note FROM dataset_changes"
                        " WHERE id = ANY(%s) ORDER BY id", pending)
    assert rows[0] == (first, "dismissed", "editor", "single")
    assert rows[1:] == [(i, "reviewed", "editor", "checked the retitles") for i in rest]
    assert queue_ids(world) == []
    queue = client.get("/harvester/api/changes", headers=as_(tokens, "admin"), params={"queue": "true"}).json()
    assert queue["total"] == 0


def test_bulk_review_refuses_as_a_whole(world, client, tokens):
    """A viewer may review nothing; an unknown id among known ones: 404 naming it. Either way
    nothing is marked."""
    ids = [r[0] for r in query(world, "SELECT id FROM dataset_changes WHERE review_outcome IS NULL"
                                      " ORDER BY id LIMIT 3")]
    assert len(ids) == 3
    before = query(world, "SELECT count(*) FROM dataset_changes WHERE review_outcome IS NOT NULL")
    viewer = client.post("/harvester/api/changes/review", headers=as_(tokens, "viewer"),
                         json={"ids": ids, "action": "reviewed"})
    assert viewer.status_code == 403, viewer.text
    unknown = client.post("/harvester/api/changes/review", headers=as_(tokens, "editor"),
                          json={"ids": ids + [987654321], "action": "dismissed"})
    assert unknown.status_code == 404 and "987654321" in unknown.json()["detail"], unknown.text
    assert "nothing was marked" in unknown.json()["detail"]
    empty = client.post("/harvester/api/changes/review", headers=as_(tokens, "editor"),
                        json={"ids": [], "action": "dismissed"})
    assert empty.status_code == 422
    assert query(world, "SELECT count(*) FROM dataset_changes WHERE review_outcome IS NOT NULL") == before


# -- export -----------------------------------------------------------------------------------------
def test_changes_export_is_the_cli_export_with_the_lists_filters(world, client, tokens, capfdbinary):
    """The changes list's filters, downloaded: the same bytes as `harvester export changes -o -`
    without filters; with change_type, exactly the changes the list shows for it."""
    from harvester.cli.main import main

    response = client.get("/harvester/api/export/changes", headers=as_(tokens, "viewer"),
                          params={"format": "csv", "portal": "test"})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/csv")
    assert "attachment" in response.headers["content-disposition"]
    capfdbinary.readouterr()
    assert main(["export", "changes", "--format", "csv", "--portal", "test", "-o", "-"]) == 0
    assert response.content == capfdbinary.readouterr().out

    retitles = client.get("/harvester/api/export/changes", headers=as_(tokens, "viewer"),
                          params={"format": "jsonl", "change_type": "title_changed", "min_significance": "0.1"})
    assert retitles.status_code == 200, retitles.text
    rows = [json.loads(line) for line in retitles.text.splitlines()]
    listed = client.get("/harvester/api/changes", headers=as_(tokens, "viewer"),
                        params={"change_type": "title_changed", "min_significance": "0.1", "limit": 500}).json()
    assert sorted(r["change_id"] for r in rows) == sorted(c["id"] for c in listed["items"])
    assert len(rows) == RETITLED and {r["change_type"] for r in rows} == {"title_changed"}

    bad = client.get("/harvester/api/export/changes", headers=as_(tokens, "viewer"),
                     params={"format": "xlsx"})
    assert bad.status_code == 422 and "format" in bad.text
    bad = client.get("/harvester/api/export/changes", headers=as_(tokens, "viewer"),
                     params={"format": "csv", "change_type": "renamed"})
    assert bad.status_code == 422 and "renamed" in bad.text


def test_datasets_export_keeps_the_search_filters(world, client, tokens):
    """The search page's filters, downloaded: the datasets with the tag, every column of
    `harvester export datasets`; all of the portal's live datasets without a filter."""
    from harvester.store.export import DATASET_COLUMNS

    tagged = client.get("/harvester/api/export/datasets", headers=as_(tokens, "viewer"),
                        params={"format": "csv", "portal": "test", "tag": "bulk-test"})
    assert tagged.status_code == 200, tagged.text
    rows = list(csv.DictReader(io.StringIO(tagged.text)))
    want = {r["id"] for r in world["records"][RETITLED:RETITLED + TAGGED]}
    assert {r["source_id"] for r in rows} == want
    assert list(rows[0]) == [c.name for c in DATASET_COLUMNS]
    assert all("bulk-test" in json.loads(r["tags"]) for r in rows)

    everything = client.get("/harvester/api/export/datasets", headers=as_(tokens, "viewer"),
                            params={"format": "jsonl"})
    assert everything.status_code == 200
    ids = {json.loads(line)["source_id"] for line in everything.text.splitlines()}
    assert ids == {r["id"] for r in world["records"]}
    unknown = client.get("/harvester/api/export/datasets", headers=as_(tokens, "viewer"),
                         params={"format": "csv", "portal": "nowhere"})
    assert unknown.status_code == 422 and "nowhere" in unknown.text


# -- run now, full sync now, reconcile now --------------------------------------------------------------
def dag_runs(dag_id: str) -> dict[str, tuple]:
    from sqlalchemy import select

    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session

    with create_session() as session:
        return {r.run_id: (r.conf, r.run_type, r.triggering_user_name, str(getattr(r.state, "value", r.state)))
                for r in session.scalars(select(DagRun).where(DagRun.dag_id == dag_id))}


def test_a_portals_dag_is_triggered_through_airflow(world, client, tokens):
    """A paused DAG: 409 saying so, no run. Unpaused (through Airflow's own API), each action makes
    a queued manual DAG run in Airflow's metadata database with the portal's params, by the user,
    linked to Airflow's grid. A viewer may not trigger; a DAG Airflow never parsed: 404 saying so."""
    dag_id = "harvest_test"
    before = dag_runs(dag_id)
    pause = client.patch(f"/api/v2/dags/{dag_id}", headers=as_(tokens, "admin"), json={"is_paused": True})
    assert pause.status_code == 200, pause.text
    paused = client.post("/harvester/api/portals/test/trigger", headers=as_(tokens, "editor"),
                         json={"action": "run"})
    assert paused.status_code == 409 and "paused" in paused.json()["detail"], paused.text
    assert dag_runs(dag_id) == before
    state = client.get("/harvester/api/portals/test/trigger", headers=as_(tokens, "editor")).json()
    assert state["can_trigger"] is True and state["paused"] is True and "paused" in state["problem"]
    assert client.get("/harvester/api/portals/test/trigger", headers=as_(tokens, "viewer")).json()["can_trigger"] is False

    unpause = client.patch(f"/api/v2/dags/{dag_id}", headers=as_(tokens, "admin"), json={"is_paused": False})
    assert unpause.status_code == 200, unpause.text
    viewer = client.post("/harvester/api/portals/test/trigger", headers=as_(tokens, "viewer"),
                         json={"action": "full_sync"})
    assert viewer.status_code == 403
    made = {}
    for action, params in (("run", {"full_sync": False, "reconcile": False}),
                           ("full_sync", {"full_sync": True, "reconcile": False}),
                           ("reconcile", {"full_sync": False, "reconcile": True})):
        response = client.post("/harvester/api/portals/test/trigger", headers=as_(tokens, "editor"),
                               json={"action": action, "force_removals": action == "reconcile"})
        assert response.status_code == 201, response.text
        answer = response.json()
        conf = {**params, "force_removals": action == "reconcile", "takeover": False}
        assert answer["dag_id"] == dag_id and answer["conf"] == conf
        assert answer["dag_run_url"] == f"/dags/{dag_id}/runs/{quote(answer['dag_run_id'], safe='')}"
        made[answer["dag_run_id"]] = conf
    runs = dag_runs(dag_id)
    for run_id, conf in made.items():
        got_conf, run_type, user, state = runs[run_id]
        assert got_conf == conf and str(getattr(run_type, "value", run_type)) == "manual"
        assert user == "editor" and state == "queued"
    assert set(runs) == set(before) | set(made)
    state = client.get("/harvester/api/portals/test/trigger", headers=as_(tokens, "editor")).json()
    assert state["problem"] is None and state["in_airflow"] is True and state["dag_url"] == f"/dags/{dag_id}"
    unparsed = client.get("/harvester/api/portals/unparsed/trigger", headers=as_(tokens, "editor")).json()
    assert unparsed["in_airflow"] is False and "not parsed yet" in unparsed["problem"]

    unparsed = client.post("/harvester/api/portals/unparsed/trigger", headers=as_(tokens, "editor"),
                           json={"action": "run"})
    assert unparsed.status_code == 404 and "harvest_unparsed" in unparsed.json()["detail"], unparsed.text
    unknown = client.post("/harvester/api/portals/nowhere/trigger", headers=as_(tokens, "editor"),
                          json={"action": "run"})
    assert unknown.status_code == 404 and "nowhere" in unknown.json()["detail"]
    bad = client.post("/harvester/api/portals/test/trigger", headers=as_(tokens, "editor"), json={"action": "wipe"})
    assert bad.status_code == 422


# -- a portal only the harvester database knows (issue 38, finding 4) ---------------------------------------
def only_other_portals(tmp_path, monkeypatch) -> None:
    """portals.yaml without the portal ``test``: only the harvester database knows it now."""
    other = tmp_path / "portals.yaml"
    other.write_text(yaml.safe_dump({"portals": [{"name": "other", "url": "http://127.0.0.1:9/other"}]}))
    monkeypatch.setenv("HARVESTER_PORTALS_FILE", str(other))


def test_a_portal_only_the_database_knows_is_exported(world, client, tokens, tmp_path, monkeypatch):
    """Removed from portals.yaml, the portal is still found by the name its runs recorded, as
    everywhere in the API: its changes and datasets export as before. A name nowhere: 422 naming
    the filter and where it looked."""
    exports = {what: dict(format="jsonl" if what == "datasets" else "csv", portal="test")
               for what in ("changes", "datasets")}

    def download(what, **params):
        response = client.get(f"/harvester/api/export/{what}", headers=as_(tokens, "viewer"), params=params)
        assert response.status_code == 200, (what, response.text)
        return response.content

    before = {what: download(what, **params) for what, params in exports.items()}
    assert all(before.values())
    only_other_portals(tmp_path, monkeypatch)
    assert {what: download(what, **params) for what, params in exports.items()} == before
    for what in exports:
        unknown = client.get(f"/harvester/api/export/{what}", headers=as_(tokens, "viewer"),
                             params={"format": "csv", "portal": "nowhere"})
        assert unknown.status_code == 422, unknown.text
        assert "portal: no portal named 'nowhere' in portals.yaml or the harvester database" in unknown.text


def test_a_portal_only_the_database_knows_has_no_dag_to_run(world, client, tokens, tmp_path, monkeypatch):
    """Removed from portals.yaml, the portal has no DAG: its trigger state says so (its page shows
    it, without an error), and a trigger is a 409 saying so, with no DAG run made. A name
    nowhere: 404."""
    only_other_portals(tmp_path, monkeypatch)
    runs = dag_runs("harvest_test")
    state = client.get("/harvester/api/portals/test/trigger", headers=as_(tokens, "editor"))
    assert state.status_code == 200, state.text
    state = state.json()
    assert (state["portal"], state["dag_id"], state["can_trigger"], state["in_airflow"], state["dag_url"]) == (
        "test", None, False, False, None)
    assert "test is not in portals.yaml: no DAG to run" in state["problem"]
    for action in ("run", "full_sync", "reconcile"):
        refused = client.post("/harvester/api/portals/test/trigger", headers=as_(tokens, "editor"),
                              json={"action": action})
        assert refused.status_code == 409, refused.text
        assert refused.json()["detail"] == state["problem"]
    assert dag_runs("harvest_test") == runs
    for method in ("get", "post"):
        unknown = getattr(client, method)("/harvester/api/portals/nowhere/trigger", headers=as_(tokens, "editor"),
                                          **({"json": {"action": "run"}} if method == "post" else {}))
        assert unknown.status_code == 404, unknown.text
        assert unknown.json()["detail"] == "no portal named 'nowhere' in portals.yaml or the harvester database"
