"""Duplicate groups in the JSON API, served by the real Airflow api-server app with Airflow's
simple auth manager (real users, passwords and tokens, as tests/ui/test_ui_api.py): search shows a
group once, a dataset's page shows its group, operators split and merge groups.

The world: a CKAN portal ("national") and a DCAT aggregator republishing its ten Birmingham
purchase-card datasets, both harvested with the local model (ten groups of two), plus data.gov.uk's
first four records on the national portal alone.
"""
from __future__ import annotations

import json
import uuid
from urllib.parse import quote

import pytest

from harvester.testing import aggregator

PASSWORDS = {"admin": "admin-pw-1", "viewer": "viewer-pw-2", "editor": "editor-pw-3"}
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
    mp.setenv("AIRFLOW__CORE__AUTH_MANAGER",
              "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager")
    mp.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS", "admin:admin,viewer:viewer,editor:user")
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
        assert "viewer may not split or merge duplicates of" in refused["detail"] and "harvest_" in refused["detail"]
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
