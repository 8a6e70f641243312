"""Duplicate groups in the JSON API, served by the real Airflow api-server app with Airflow's
simple auth manager (real users, passwords and tokens, as tests/ui/test_ui_api.py): search shows a
group once, a dataset's page shows its group, operators split and merge groups.

The world: a CKAN portal ("national") and a DCAT aggregator republishing its ten Birmingham
purchase-card datasets, both harvested with the local model (ten groups of two), plus data.gov.uk's
first four records on the national portal alone.

Airflow's auth manager is the simple one with per-DAG edit rights on top
(harvester.testing.per_dag_auth): ``nat_editor`` may edit harvest_national only, ``etl_editor`` a
DAG that harvests nothing; the other users are the simple manager's roles.
"""
from __future__ import annotations

import json
import uuid
from urllib.parse import quote

import pytest

from harvester.testing import aggregator, per_dag_auth

PASSWORDS = {"admin": "admin-pw-1", "viewer": "viewer-pw-2", "editor": "editor-pw-3", "op": "op-pw-4",
             "nat_editor": "nat-editor-pw-5", "etl_editor": "etl-editor-pw-6"}
EDITORS = {"nat_editor": ["harvest_national"], "etl_editor": ["etl_daily"]}  # per-DAG edit rights
BIRMINGHAM = "data-birmingham-gov-uk.jsonl"
UK = "data-gov-uk.jsonl"
API = "/harvester/api"


@pytest.fixture(scope="module")
def world(pg_server, template_db, airflow_db, tmp_path_factory, samples):
    import psycopg
    import yaml

    from harvester.config.portals import load_portals
    from harvester.embeddings.local import LocalProvider
    from harvester.pipeline import steps as pipeline
    from harvester.store import db as store_db
    from harvester.testing.ckan_portal import DemoPortal
    from harvester.testing.dcat_portal import DcatServer

    mp = pytest.MonkeyPatch()
    name = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_server.url("postgres"), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template_db}"')
    url = pg_server.url(name)
    tmp = tmp_path_factory.mktemp("ui-duplicates")
    passwords = tmp / "passwords.json"
    passwords.write_text(json.dumps(PASSWORDS))
    mp.setenv("HARVESTER_DATABASE_URL", url)
    mp.setenv("AIRFLOW_CONN_HARVESTER_DB", url)
    mp.setenv("AIRFLOW__CORE__AUTH_MANAGER", per_dag_auth.AUTH_MANAGER)
    mp.setenv("AIRFLOW__HARVESTER_TESTING__DAG_EDITORS", per_dag_auth.policy(EDITORS))
    mp.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS",
              "admin:admin,viewer:viewer,editor:user,op:op,nat_editor:user,etl_editor:user")
    mp.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE", str(passwords))
    mp.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS", "False")
    mp.setenv("AIRFLOW__API_AUTH__JWT_SECRET", uuid.uuid4().hex * 2)
    copied, alone = samples(BIRMINGHAM), samples(UK)[:4]
    portal, dcat = DemoPortal(records=copied + alone), DcatServer()
    portal.start()
    dcat.start()
    try:
        dcat.set_document("/catalog.ttl", aggregator.catalogue(copied, portal.base_url), "text/turtle")
        path = tmp / "portals.yaml"
        path.write_text(yaml.safe_dump({"portals": [
            {"name": "national", "url": portal.base_url, "politeness_delay": 0, "max_retries": 0},
            {"name": "aggregator", "url": dcat.url("/catalog.ttl"), "type": "dcat-rdf", "politeness_delay": 0,
             "max_retries": 0}]}))
        mp.setenv("HARVESTER_PORTALS_FILE", str(path))
        nat, agg = load_portals(path)
        provider = LocalProvider()
        with store_db.prepare(store_db.connect_url(url)) as conn, \
                store_db.prepare(store_db.connect_url(url)) as reader:
            for p in (nat, agg):
                stats = pipeline.harvest(conn, reader, p, pipeline.source_for(p), provider, full_sync=True)
                assert stats["failed"] == 0
            assert conn.execute("SELECT count(DISTINCT group_id) FROM duplicate_members").fetchone()[0] == len(copied)
        yield {"url": url, "copied": copied, "alone": alone, "nat": nat, "agg": agg,
               "agg_ids": {r["id"]: sid for r, sid in zip(copied, _aggregator_ids(url, agg.url, copied))}}
    finally:
        dcat.stop()
        portal.stop()
        mp.undo()
        with psycopg.connect(pg_server.url("postgres"), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _aggregator_ids(url: str, agg_url: str, copied: list[dict]) -> list[str]:
    """The aggregator's source id of each copied record (its IRI, testing/aggregator.dataset_iri)."""
    import psycopg

    with psycopg.connect(url) as conn:
        held = {r[0] for r in conn.execute("SELECT source_id FROM datasets WHERE portal_url = %s", (agg_url,))}
    ids = [aggregator.dataset_iri(n, r) for n, r in enumerate(copied)]
    assert set(ids) == held
    return ids


def as_(tokens, user):
    return {"Authorization": f"Bearer {tokens[user]}"}


def get(client, tokens, path, user="admin", **params):
    response = client.get(API + path, headers=as_(tokens, user), params=params)
    assert response.status_code == 200, (path, response.status_code, response.text)
    return response.json()


def post(client, tokens, path, body, user="admin", status=200):
    response = client.post(API + path, headers=as_(tokens, user), json=body)
    assert response.status_code == status, (path, body, response.status_code, response.text)
    return response.json()


def test_search_shows_a_group_once_unless_all_copies(client, tokens, world):
    record = world["copied"][1]
    found = get(client, tokens, "/search", "viewer", q=record["title"], limit=5, mode="text")
    best = found["items"][0]
    assert (best["portal"], best["source_id"], best["canonical"], best["copies"]) == (
        "national", record["id"], True, 1)
    (other,) = best["also_on"]
    assert (other["portal"], other["source_id"], other["title"]) == (
        "aggregator", world["agg_ids"][record["id"]], record["title"])
    assert other["dataset_page"].endswith(f"/harvester/datasets/aggregator/{quote(other['source_id'], safe='')}")
    assert [i["title"] for i in found["items"]].count(record["title"]) == 1

    every = get(client, tokens, "/search", "viewer", q=record["title"], limit=5, mode="text", all_copies="true")
    copies = [i for i in every["items"] if i["title"] == record["title"]]
    assert {(i["portal"], i["canonical"]) for i in copies} == {("national", True), ("aggregator", False)}
    assert {i["group_id"] for i in copies} == {best["group_id"]}

    through = get(client, tokens, "/search", q=record["title"], limit=3, mode="text", portal="aggregator")["items"][0]
    assert (through["portal"], through["canonical"], [c["portal"] for c in through["also_on"]]) == (
        "aggregator", False, ["national"])
    lone = world["alone"][0]
    alone = get(client, tokens, "/search", q=lone["title"], limit=3, mode="text")["items"][0]
    assert (alone["source_id"], alone["group_id"], alone["also_on"], alone["copies"]) == (lone["id"], None, [], 0)


def test_a_datasets_page_shows_its_group_and_a_portal_its_copies(client, tokens, world):
    record = world["copied"][2]
    dataset = get(client, tokens, f"/datasets/national/{record['id']}", "viewer")
    group = dataset["group"]
    assert group["group_id"] is not None and dataset["can_edit_group"] is False  # a viewer
    assert [(m["portal"], m["source_id"], m["is_canonical"], m["evidence"]) for m in group["members"]] == [
        ("national", record["id"], True, "identifier"),
        ("aggregator", world["agg_ids"][record["id"]], False, "identifier")]
    assert all(0 < m["confidence"] <= 1 and m["dataset_page"] for m in group["members"])
    assert get(client, tokens, f"/datasets/national/{record['id']}", "editor")["can_edit_group"] is True
    lone = get(client, tokens, f"/datasets/national/{world['alone'][0]['id']}")["group"]
    assert (lone["group_id"], lone["members"], lone["overrides"]) == (None, [], [])

    nat = get(client, tokens, "/portals/national")["duplicates"]
    assert nat["copied_by"] == [{"portal_url": world["agg"].url, "portal_name": "aggregator", "datasets": 10,
                                 "portal": "aggregator"}] and nat["copies_of"] == []
    agg = get(client, tokens, "/portals/aggregator")["duplicates"]
    assert [(c["portal"], c["datasets"]) for c in agg["copies_of"]] == [("national", 10)] and agg["copies"] == 10

    listed = get(client, tokens, "/duplicates", portal="aggregator", limit=3)
    assert listed["total"] == 10 and len(listed["items"]) == 3
    assert all(len(g["members"]) == 2 for g in listed["items"])


def test_split_and_merge_then_the_page_shows_it(client, tokens, world):
    record = world["copied"][3]
    agg_id = world["agg_ids"][record["id"]]
    page = f"/datasets/aggregator/{quote(agg_id, safe='')}"
    before = get(client, tokens, page)["group"]["group_id"]

    split = post(client, tokens, "/duplicates/split", {"portal": "aggregator", "source_id": agg_id,
                                                        "note": "a different extract"}, user="editor")
    assert split["group_id"] is None and split["members"] == []
    assert [(o["decision"], o["decided_by"], o["note"]) for o in split["overrides"]] == [
        ("different", "editor", "a different extract")]
    shown = get(client, tokens, page)["group"]
    assert shown["group_id"] is None and shown["overrides"][0]["decided_by"] == "editor"
    assert get(client, tokens, f"/datasets/national/{record['id']}")["group"]["group_id"] is None
    found = get(client, tokens, "/search", q=record["title"], limit=5, mode="text")["items"]
    assert {i["portal"] for i in found if i["title"] == record["title"]} == {"national", "aggregator"}

    merged = post(client, tokens, "/duplicates/merge", {"portal": "aggregator", "source_id": agg_id,
                                                         "other_portal": "national", "other_source_id": record["id"]})
    assert [(m["portal"], m["source_id"]) for m in merged["members"]] == [("national", record["id"]),
                                                                           ("aggregator", agg_id)]
    assert [(o["decision"], o["decided_by"]) for o in merged["overrides"]] == [("same", "admin")]
    assert get(client, tokens, f"/datasets/national/{record['id']}")["group"]["group_id"] == merged["group_id"]
    assert merged["group_id"] is not None and before is not None

    # two unrelated datasets merged by hand; forgetting lets the evidence decide again
    lone = world["alone"][1]
    pair = post(client, tokens, "/duplicates/merge", {"portal": "national", "source_id": lone["id"],
                                                       "other_portal": "aggregator", "other_source_id": agg_id,
                                                       "note": "same survey"})
    assert {m["source_id"] for m in pair["members"]} == {lone["id"], agg_id, record["id"]}
    assert {m["evidence"] for m in pair["members"] if m["source_id"] == lone["id"]} == {"override"}
    forgot = post(client, tokens, "/duplicates/forget", {"portal": "national", "source_id": lone["id"]})
    assert forgot["forgotten"] == 1 and forgot["group"]["group_id"] is None
    assert get(client, tokens, page)["group"]["group_id"] == merged["group_id"]  # its own override stays


def test_decisions_need_review_rights_and_name_what_is_missing(client, tokens, world):
    record = world["copied"][4]
    body = {"portal": "national", "source_id": record["id"]}
    assert client.post(API + "/duplicates/split", json=body).status_code == 401
    for path, payload in (("/duplicates/split", body), ("/duplicates/forget", body),
                          ("/duplicates/merge", {**body, "other_portal": "aggregator",
                                                 "other_source_id": world["agg_ids"][record["id"]]})):
        refused = post(client, tokens, path, payload, user="viewer", status=403)
        assert refused["detail"] == REFUSED.format(user="viewer")
    assert get(client, tokens, f"/datasets/national/{record['id']}")["group"]["overrides"] == []

    missing = post(client, tokens, "/duplicates/split", {"portal": "national", "source_id": "no-such-id"}, status=404)
    assert missing["detail"] == "no dataset with id 'no-such-id' in portal national"
    gone = post(client, tokens, "/duplicates/merge", {**body, "other_portal": "aggregator",
                                                       "other_source_id": "nope"}, status=404)
    assert gone["detail"] == "no dataset with id 'nope' in portal aggregator"
    assert "no portal named 'elsewhere'" in post(client, tokens, "/duplicates/forget",
                                                 {"portal": "elsewhere", "source_id": "x"}, status=404)["detail"]
    itself = post(client, tokens, "/duplicates/merge", {**body, "other_portal": "national",
                                                         "other_source_id": record["id"]}, status=422)
    assert "cannot be merged with itself" in json.dumps(itself)
    itself = post(client, tokens, "/duplicates/split", {**body, "from": [body]}, status=422)
    assert "cannot be split from itself" in json.dumps(itself)
    lone = world["alone"][2]
    alone = post(client, tokens, "/duplicates/split", {"portal": "national", "source_id": lone["id"]}, status=409)
    assert "is in no duplicate group" in alone["detail"]
    post(client, tokens, "/duplicates/split", {**body, "extra": 1}, status=422)
    assert get(client, tokens, f"/datasets/national/{record['id']}")["group"]["group_id"] is not None


# -- who may write: every write route, and every portal an operation decides about (issue 35) -----------
WRITE_METHODS = {"POST", "PUT", "PATCH", "DELETE"}
REFUSED = ("{user} may not edit any harvest DAG (harvest_aggregator, harvest_national): the Harvester's write "
           "routes need edit access (PUT) to at least one")


def write_routes():
    """(method, path, route) of every write route of the Harvester app, as the app holds them."""
    from fastapi.routing import APIRoute

    from harvester.ui.app import app

    return [(method, route.path, route) for route in app.routes if isinstance(route, APIRoute)
            for method in sorted(route.methods & WRITE_METHODS)]


def test_every_write_route_is_gated_before_its_body_is_read():
    """Walks the app: a write route must declare a write gate (auth.writer, or auth.validator for
    validate), and the gate must run before FastAPI reads and parses the body (a route of the
    app's GatedRoute class, or one that reads its body itself)."""
    from harvester.ui import auth

    found = write_routes()
    assert {(m, p) for m, p, _ in found} >= {
        ("POST", "/api/changes/{change_id}/review"), ("POST", "/api/duplicates/split"),
        ("POST", "/api/duplicates/merge"), ("POST", "/api/duplicates/forget"), ("POST", "/api/validate")}
    for method, path, route in found:
        gates = [d.call for d in route.dependant.dependencies if d.call in auth.WRITE_GATES]
        assert gates, f"{method} {path} has no write gate (Depends(auth.writer))"
        assert isinstance(route, auth.GatedRoute) or route.body_field is None, (
            f"{method} {path} reads its body before its gate")


def test_whoever_may_not_write_is_refused_first_on_every_write_route(client, tokens, world):
    """Before its body is read, an id looked up or a 404 / 422: 401 without a token, 403 for a user
    who may edit no harvest DAG (a viewer, a user who may edit another DAG only, a user of no role)."""
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser

    nobody = get_auth_manager().generate_jwt(SimpleAuthManagerUser(username="nobody", role=None))
    record = world["copied"][7]
    real = {"portal": "national", "source_id": record["id"], "other_portal": "aggregator",
            "other_source_id": world["agg_ids"][record["id"]], "action": "reviewed", "url": "http://127.0.0.1/"}
    bodies = [{"json": real}, {"json": {}}, {"json": {"portal": "elsewhere", "source_id": "no-such-id"}},
              {"content": b"{not json", "headers": {"Content-Type": "application/json"}},
              {"content": b"\x00" * 64, "headers": {"Content-Type": "application/octet-stream"}}]
    before = _decisions(world, [])
    for method, path, _ in write_routes():
        for change_id in ("0", "999999", "not-a-number") if "{change_id}" in path else ("",):
            url = "/harvester" + path.replace("{change_id}", change_id)
            for body in bodies:
                headers = body.get("headers", {})
                send = {k: v for k, v in body.items() if k != "headers"}
                response = client.request(method, url, headers=headers, **send)
                assert (response.status_code, response.headers.get("www-authenticate")) == (401, "Bearer"), (
                    url, body, response.text)
                for user, token in (("viewer", tokens["viewer"]), ("etl_editor", tokens["etl_editor"]),
                                    ("nobody", nobody)):
                    response = client.request(method, url, headers={**headers, "Authorization": f"Bearer {token}"},
                                              **send)
                    assert (response.status_code, response.json()) == (
                        403, {"detail": REFUSED.format(user=user)}), (user, url, body, response.text)
    assert _decisions(world, []) == before
    assert get(client, tokens, "/me", "etl_editor") == {"user": "etl_editor", "can_review": False}
    assert get(client, tokens, "/me", "nat_editor") == {"user": "nat_editor", "can_review": True}


def _decisions(world, source_ids: list[tuple[str, str]]):
    """The overrides in the database (all of them), and the group of each (portal, source id)."""
    import psycopg

    urls = {"national": world["nat"].url, "aggregator": world["agg"].url}
    with psycopg.connect(world["url"]) as conn:
        overrides = conn.execute("SELECT a, b, decision, decided_by FROM duplicate_overrides ORDER BY a, b").fetchall()
        groups = [conn.execute("SELECT m.group_id FROM datasets d LEFT JOIN duplicate_members m ON m.dataset_id = d.id"
                               " WHERE d.portal_url = %s AND d.source_id = %s", (urls[p], s)).fetchone()
                  for p, s in source_ids]
    return overrides, groups


def test_a_split_needs_the_portal_of_every_member_it_decides_about(client, tokens, world):
    """nat_editor may edit harvest_national only: splitting a national dataset from its group
    (whose other member is the aggregator's) decides about the aggregator's dataset too."""
    record = world["copied"][5]
    agg_id = world["agg_ids"][record["id"]]
    members = [("national", record["id"]), ("aggregator", agg_id)]
    before = _decisions(world, members)
    assert before[1][0] == before[1][1] and before[1][0][0] is not None  # one group

    refused = post(client, tokens, "/duplicates/split", {"portal": "national", "source_id": record["id"]},
                   user="nat_editor", status=403)
    assert refused["detail"] == (f"nat_editor may not edit harvest_aggregator: splitting {record['id']!r} of "
                                 "national from its group decides about datasets of aggregator; nothing was changed")
    refused = post(client, tokens, "/duplicates/split", {"portal": "national", "source_id": record["id"],
                                                          "from": [{"portal": "aggregator", "source_id": agg_id}]},
                   user="nat_editor", status=403)
    assert refused["detail"] == (f"nat_editor may not edit harvest_aggregator: splitting {record['id']!r} of "
                                 "national from the datasets named decides about datasets of aggregator; nothing "
                                 "was changed")
    assert _decisions(world, members) == before

    split = post(client, tokens, "/duplicates/split", {"portal": "national", "source_id": record["id"]}, user="op")
    assert split["group_id"] is None and [(o["decision"], o["decided_by"]) for o in split["overrides"]] == [
        ("different", "op")]


def test_forget_needs_the_portal_of_every_decision_it_drops(client, tokens, world):
    """An admin tied a national dataset to an aggregator's: nat_editor may not drop that decision
    (it is about the aggregator's dataset too), nor merge across the two portals."""
    record, lone = world["copied"][6], world["alone"][3]
    agg_id = world["agg_ids"][record["id"]]
    pair = {"portal": "national", "source_id": lone["id"], "other_portal": "aggregator", "other_source_id": agg_id}
    merged = post(client, tokens, "/duplicates/merge", {**pair, "note": "same survey"})
    assert {m["source_id"] for m in merged["members"]} == {lone["id"], agg_id}  # the decision wins over evidence
    members = [("national", lone["id"]), ("aggregator", agg_id), ("national", record["id"])]
    before = _decisions(world, members)

    refused = post(client, tokens, "/duplicates/forget", {"portal": "national", "source_id": lone["id"]},
                   user="nat_editor", status=403)
    assert refused["detail"] == (f"nat_editor may not edit harvest_aggregator: forgetting the overrides about "
                                 f"{lone['id']!r} of national decides about datasets of aggregator; nothing was "
                                 "changed")
    assert _decisions(world, members) == before
    assert ("same", "admin") in {(d, by) for _, _, d, by in before[0]}
    refused = post(client, tokens, "/duplicates/merge", pair, user="nat_editor", status=403)
    assert refused["detail"] == (f"nat_editor may not edit harvest_aggregator: merging {lone['id']!r} of national "
                                 f"with {agg_id!r} of aggregator decides about datasets of aggregator; nothing was "
                                 "changed")
    assert _decisions(world, members) == before

    forgot = post(client, tokens, "/duplicates/forget", {"portal": "national", "source_id": lone["id"]},
                  user="editor")
    assert forgot["forgotten"] == 1 and forgot["group"]["group_id"] is None
    # with no decision about it left, forgetting concerns national alone: nat_editor may
    again = post(client, tokens, "/duplicates/forget", {"portal": "national", "source_id": lone["id"]},
                 user="nat_editor")
    assert again["forgotten"] == 0


def test_a_decision_during_a_long_grouping_is_refused_with_503_and_changes_nothing(client, tokens, world,
                                                                                  monkeypatch):
    """A grouping after a run's commit holds the groups' lock for as long as it takes (minutes for a
    first scan of a large portal): an operator's split waits HARVESTER_LOCK_TIMEOUT_SECS, then is
    told so (503), not a 500."""
    import psycopg

    from harvester.store import duplicates

    monkeypatch.setenv("HARVESTER_LOCK_TIMEOUT_SECS", "1")
    record = world["copied"][2]
    before = get(client, tokens, f"/datasets/national/{record['id']}")["group"]
    assert before["group_id"] is not None
    with psycopg.connect(world["url"]) as grouping:
        grouping.execute("SELECT pg_advisory_xact_lock(%s)", (duplicates._LOCK_KEY,))
        busy = post(client, tokens, "/duplicates/split", {"portal": "national", "source_id": record["id"]}, status=503)
        grouping.rollback()
    assert "a duplicate grouping held the groups' lock for more than 1s" in busy["detail"]
    assert "nothing was changed" in busy["detail"]
    assert get(client, tokens, f"/datasets/national/{record['id']}")["group"] == before
