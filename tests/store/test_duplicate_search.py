"""Search over duplicate groups, on a real PostgreSQL: a CKAN portal ("national") and a DCAT
aggregator that republishes its ten Birmingham purchase-card datasets (testing/aggregator.py),
both harvested with the local model, so ten groups of two (as tests/pipeline/test_duplicates.py
groups them). A group is one result, shown through its canonical member unless only another
member matched; ``all_copies`` shows every member."""
import json

import pytest
import yaml

from harvester.config.portals import Portal
from harvester.pipeline import steps as pipeline
from harvester.store.search import SearchFilters, SearchSettings, search
from harvester.testing import aggregator
from harvester.testing.dcat_portal import DcatServer

UK = "data-gov-uk.jsonl"
BIRMINGHAM = "data-birmingham-gov-uk.jsonl"
QUERY = "purchase card transactions"


@pytest.fixture(scope="module")
def provider():
    from harvester.embeddings.local import LocalProvider

    return LocalProvider()


@pytest.fixture
def world(db, reader, portal_server, samples, provider, tmp_path, monkeypatch):
    """National: the Birmingham records and data.gov.uk's first four (unique names, UUID ids);
    the aggregator copies the Birmingham ones."""
    copied = samples(BIRMINGHAM)
    alone = samples(UK)[:4]
    portal_server.set_records(copied + alone)
    with DcatServer() as dcat:
        dcat.set_document("/catalog.ttl", aggregator.catalogue(copied, portal_server.base_url), "text/turtle")
        # English records: the national portal says so, as the aggregator's copies do (their titles are
        # tagged @en, so they are indexed in English: both sides of a group rank alike)
        nat = Portal(name="national", url=portal_server.base_url, politeness_delay=0, max_retries=0,
                     language="english")
        agg = Portal(name="aggregator", url=dcat.url("/catalog.ttl"), type="dcat-rdf", politeness_delay=0,
                     max_retries=0)
        for p in (nat, agg):
            stats = pipeline.harvest(db, reader, p, pipeline.source_for(p), provider, full_sync=True)
            assert stats["failed"] == 0
    path = tmp_path / "portals.yaml"
    path.write_text(yaml.safe_dump({"portals": [
        {"name": "national", "url": nat.url, "politeness_delay": 0, "language": "english"},
        {"name": "aggregator", "url": agg.url, "type": "dcat-rdf", "politeness_delay": 0}]}))
    monkeypatch.setenv("HARVESTER_PORTALS_FILE", str(path))
    groups = db.execute("SELECT count(DISTINCT group_id), count(*) FROM duplicate_members").fetchone()
    assert groups == (len(copied), 2 * len(copied))  # the set-up this module relies on
    return {"nat": nat, "agg": agg, "copied": copied, "alone": alone}


def test_a_group_is_found_once_and_names_the_other_portal(world, db, provider):
    nat, agg = world["nat"], world["agg"]
    record = world["copied"][0]
    found = search(db, record["title"], limit=5, provider=provider)
    best = found.items[0]
    assert (best["portal_url"], best["source_id"], best["title"]) == (nat.url, record["id"], record["title"])
    assert best["canonical"] is True and best["group_id"] is not None
    assert [(c["portal_url"], c["portal_name"], c["title"]) for c in best["also_on"]] == [
        (agg.url, "aggregator", record["title"])]
    assert best["copies"] == 1 and best["also_on"][0]["dataset_id"] != best["dataset_id"]
    # each group once
    groups = [i["group_id"] for i in found.items if i["group_id"] is not None]
    assert len(groups) == len(set(groups))
    assert [i["title"] for i in found.items].count(record["title"]) == 1

    every = search(db, record["title"], limit=5, provider=provider, all_copies=True)
    copies = [i for i in every.items if i["title"] == record["title"]]
    assert {i["portal_url"] for i in copies} == {nat.url, agg.url}
    assert {i["group_id"] for i in copies} == {best["group_id"]}
    for item in copies:
        other = agg.url if item["portal_url"] == nat.url else nat.url
        assert [c["portal_url"] for c in item["also_on"]] == [other] and item["copies"] == 1
        assert item["canonical"] is (item["portal_url"] == nat.url)


def test_a_portal_filter_finds_the_group_through_its_member_there(world, db, provider):
    nat, agg = world["nat"], world["agg"]
    record = world["copied"][0]
    for mode in ("hybrid", "text", "vector"):
        found = search(db, record["title"], mode=mode, limit=5, provider=provider,
                       filters=SearchFilters(portal_url=agg.url))
        assert {i["portal_url"] for i in found.items} == {agg.url}, mode
        # (the vector side alone ranks these near-identical titles loosely: the copy is among them)
        best = next(i for i in found.items if i["title"] == record["title"])
        assert best["canonical"] is False and best["group_id"] is not None, mode
        assert [(c["portal_url"], c["source_id"]) for c in best["also_on"]] == [(nat.url, record["id"])], mode


def test_a_dataset_alone_has_no_group(world, db, provider):
    record = world["alone"][0]
    best = search(db, record["title"], limit=3, provider=provider).items[0]
    assert (best["source_id"], best["group_id"], best["also_on"], best["copies"], best["canonical"]) == (
        record["id"], None, [], 0, True)


def test_the_limit_is_filled_when_groups_collapse(world, db, provider):
    # Each side's top 4 would hold two groups (a copy ranks next to its source): fetching
    # twice as many before collapsing still gives four.
    tight = SearchSettings(candidates=4)
    for mode in ("text", "hybrid"):
        every = search(db, QUERY, mode=mode, limit=4, settings=tight, provider=provider, all_copies=True)
        assert len({i["group_id"] for i in every.items}) < 4, mode  # the case this test is about
        found = search(db, QUERY, mode=mode, limit=4, settings=tight, provider=provider)
        assert len(found.items) == 4, mode
        assert len({i["group_id"] for i in found.items}) == 4 and None not in {i["group_id"] for i in found.items}
        assert all(i["canonical"] and i["portal_url"] == world["nat"].url for i in found.items), mode
        assert [i["rank"] for i in found.items] == [1, 2, 3, 4]
        scores = [i["score"] for i in found.items]
        assert scores == sorted(scores, reverse=True)


def test_the_cli_prints_the_other_portals(world, capsys):
    from harvester.cli.main import main

    record = world["copied"][0]
    capsys.readouterr()
    assert main(["search", record["title"], "--mode", "text", "--limit", "3"]) == 0
    out = capsys.readouterr().out
    assert "also on: aggregator" in out
    assert main(["search", record["title"], "--mode", "text", "--limit", "3", "--json"]) == 0
    best = json.loads(capsys.readouterr().out)[0]
    assert (best["portal"], best["canonical"], best["copies"]) == ("national", True, 1)
    assert [(c["portal"], c["source_id"] is not None) for c in best["also_on"]] == [("aggregator", True)]
    assert main(["search", record["title"], "--mode", "text", "--limit", "3", "--json", "--all-copies"]) == 0
    every = json.loads(capsys.readouterr().out)
    assert {r["portal"] for r in every if r["title"] == record["title"]} == {"national", "aggregator"}
