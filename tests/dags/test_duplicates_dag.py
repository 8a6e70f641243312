"""Cross-portal duplicate groups through real Airflow (dag.test() of three harvest DAGs), real HTTP
and a real PostgreSQL: a national CKAN portal, a DCAT aggregator that republishes part of it under
its own IRIs with dct:identifier and landing pages pointing back (testing/aggregator.py), and a
second national portal with an unrelated dataset of the same title as a republished one.

What must be grouped is worked out here from the records (which ones the aggregator copies), not
from the code under test."""
from __future__ import annotations

import copy
import re
from datetime import datetime, timedelta, timezone

import pytest
import yaml

from harvester.store import duplicates
from harvester.store.search import SearchFilters, search
from harvester.testing import aggregator
from harvester.testing.dagtest import Harvest
from harvester.testing.samples import load_samples

UK = "data-gov-uk.jsonl"
DECOY_ID = "0c0ffee0-0000-4000-8000-000000000001"
_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


@pytest.fixture
def servers(catalogue):
    from harvester.testing.ckan_portal import DemoPortal

    with DemoPortal(records=[]) as national, DemoPortal(records=[]) as other:
        yield national, catalogue, other


def _decoy(record: dict) -> dict:
    other = copy.deepcopy(record)
    other.update(id=DECOY_ID, name="same-title-elsewhere", notes="A survey of something else, by another body.",
                 organization={"name": "other-body", "title": "Another Public Body"},
                 resources=[{"url": "https://other.example/data.csv", "format": "CSV", "name": "data"}], extras=[],
                 url=None)
    return other


def _groups(db) -> set[frozenset]:
    out: dict[int, set] = {}
    for g, portal, source in db.execute("SELECT m.group_id, d.portal_url, d.source_id FROM duplicate_members m"
                                        " JOIN datasets d ON d.id = m.dataset_id"):
        out.setdefault(g, set()).add((portal, source))
    return {frozenset(m) for m in out.values()}


def _ok(harvest: Harvest):
    dag_run = harvest.run()
    assert str(getattr(dag_run.state, "value", dag_run.state)) == "success", harvest.task_states(dag_run)
    return dag_run


def test_three_portals_through_airflow(airflow_db, database_url, db, servers, tmp_path, monkeypatch, gemini):
    national_server, dcat_server, other_server = servers
    records = load_samples(UK)
    names = [r.get("name") for r in records]
    copied = [r for r in records if _UUID.match(r["id"]) or names.count(r.get("name")) == 1][:4]
    national_server.set_records(records)
    dcat_server.set_document("/catalog.ttl", aggregator.catalogue(copied, national_server.base_url), "text/turtle")
    other_server.set_records([_decoy(copied[0])])
    agg_url = dcat_server.url("/catalog.ttl")
    entries = [{"name": "national", "url": national_server.base_url},
               {"name": "aggregator", "url": agg_url, "type": "dcat-rdf"},
               {"name": "other", "url": other_server.base_url}]
    path = tmp_path / "portals.yaml"
    path.write_text(yaml.safe_dump({"portals": [
        {**e, "schedule": None, "enabled": True, "politeness_delay": 0, "lookback": "1h"} for e in entries]}))
    monkeypatch.setenv("HARVESTER_PORTALS_FILE", str(path))
    national, agg, other = (Harvest(tmp_path, monkeypatch, name=e["name"]) for e in entries)
    for h in (national, agg, other):
        _ok(h)

    # the republished datasets are grouped, the aggregator's member is the copy
    expected = {frozenset({(national_server.base_url, r["id"]), (agg_url, aggregator.dataset_iri(n, r))})
                for n, r in enumerate(copied)}
    assert _groups(db) == expected
    assert set(db.execute("SELECT d.portal_url, m.is_canonical, m.copy_of FROM duplicate_members m"
                          " JOIN datasets d ON d.id = m.dataset_id").fetchall()) == {
        (national_server.base_url, True, False), (agg_url, False, True)}
    # the same title from another publisher is not grouped
    decoy = duplicates.find_dataset_id(db, other_server.base_url, DECOY_ID)
    assert duplicates.group_of(db, decoy)["group_id"] is None

    # search shows a group once (the canonical member, also on the aggregator); all_copies shows both;
    # a filter on the aggregator reaches the group through its (non-canonical) member
    title = copied[1]["title"]
    once = search(db, title, mode="text", limit=10)
    hits = [i for i in once.items if i["title"] == title]
    assert len(hits) == 1 and hits[0]["portal_url"] == national_server.base_url
    assert [m["portal_url"] for m in hits[0]["also_on"]] == [agg_url]
    every = search(db, title, mode="text", limit=10, all_copies=True)
    assert {i["portal_url"] for i in every.items if i["title"] == title} == {national_server.base_url, agg_url}
    through = search(db, title, mode="text", limit=10, filters=SearchFilters(portal_url=agg_url))
    hits = [i for i in through.items if i["title"] == title]
    assert len(hits) == 1 and hits[0]["portal_url"] == agg_url and hits[0]["group_id"] is not None
    assert [m["portal_url"] for m in hits[0]["also_on"]] == [national_server.base_url]

    # edited on the source portal: still grouped, in the same group
    first = copied[0]
    group_before = duplicates.group_of(db, duplicates.find_dataset_id(db, national_server.base_url, first["id"]))
    edited = copy.deepcopy(records)
    for r in edited:
        if r["id"] == first["id"]:
            r["title"], r["notes"] = r["title"] + " (revised)", "Revised description of the dataset."
            r["metadata_modified"] = (datetime.now(timezone.utc) - timedelta(minutes=1)).strftime("%Y-%m-%dT%H:%M:%S.%f")
    national_server.set_records(edited)
    _ok(national)
    group_after = duplicates.group_of(db, duplicates.find_dataset_id(db, national_server.base_url, first["id"]))
    assert group_after["group_id"] == group_before["group_id"]
    assert db.execute("SELECT title FROM datasets WHERE source_id = %s", (first["id"],)).fetchone()[0].endswith(
        "(revised)")

    # removed on the source: the aggregator's copy is the group's only live member (and canonical)
    gone = copied[1]
    national_server.set_records([r for r in edited if r["id"] != gone["id"]])
    dag_run = national.run(full_sync=True)
    assert str(getattr(dag_run.state, "value", dag_run.state)) == "success"
    members = duplicates.group_of(db, duplicates.find_dataset_id(db, national_server.base_url, gone["id"]))["members"]
    assert [(m["portal_url"], m["is_canonical"]) for m in members if m["live"]] == [(agg_url, True)]
    assert len(members) == 2

    # a manual split survives the next runs of both portals
    third = duplicates.find_dataset_id(db, agg_url, aggregator.dataset_iri(2, copied[2]))
    duplicates.split(db, third, by="test")
    _ok(agg)
    dag_run = national.run(full_sync=True)
    assert str(getattr(dag_run.state, "value", dag_run.state)) == "success"
    assert duplicates.group_of(db, third)["group_id"] is None
    assert _groups(db) == {g for g in expected if (agg_url, aggregator.dataset_iri(2, copied[2])) not in g}
